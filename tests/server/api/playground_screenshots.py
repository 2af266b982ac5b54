"""Screenshots of the playground for docs/playground/: each mode, and a phone-sized screen, over the
bundled models on a live server, driven by the same page object as the browser tests.

    .venv/bin/python -m tests.server.api.playground_screenshots [--out docs/playground]

Needs what the browser tests need (selenium; Debian's chromium and chromium-driver).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from quill.models.loading.checkpoint import BUNDLED_DIR
from quill.server.config import DEFAULT_MODELS
from tests.conftest import LiveServer
from tests.server.api.playground_page import PlaygroundPage, missing_browser, start_browser

DESKTOP_VIEW = (1280, 800)
PHONE_VIEW = (390, 844)
RICHARD = "Now is the winter of our discontent\nMade glorious summer by this sun of York;"


def set_viewport(driver, size: tuple[int, int], mobile: bool = False) -> None:
    """The exact CSS viewport of the shot (a window's size includes what the browser draws around it)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": mobile})


def hover_token(page: PlaygroundPage, index: int) -> None:
    from selenium.webdriver import ActionChains

    page.js("window.scrollTo(0, 0)")  # Run scrolled to the button; the shot shows the page from its top
    spans = page.token_spans()
    ActionChains(page.driver).move_to_element(spans[min(index, len(spans) - 1)]).perform()
    page.wait(page.tip, "the alternatives tip")


def shoot(page: PlaygroundPage, path: Path) -> None:
    page.wait(lambda: " 0 running" in page.server_gauges(), "the gauges to show the finished request")
    time.sleep(0.3)  # let the last repaint land
    page.driver.save_screenshot(str(path))
    print(f"wrote {path}")


def generate(page: PlaygroundPage, out: Path) -> None:
    page.open()
    page.choose_model("shakespeare-transformer")
    page.fill("prompt", "ROMEO:")
    for field, value in (("max_tokens", 60), ("temperature", 0.8), ("top_p", 0.95), ("seed", 7)):
        page.fill(field, value)
    page.run()
    page.wait_idle()
    hover_token(page, 9)
    shoot(page, out / "generate.png")


def compare(page: PlaygroundPage, out: Path) -> None:
    page.open()
    page.set_mode("compare")
    page.choose_model("shakespeare-transformer")
    page.fill("prompt", "JULIET:")
    page.fill("max_tokens", 36)
    page.fill("seed", 7)
    page.run()
    page.wait_idle()
    page.js("window.scrollTo(0, 0)")
    shoot(page, out / "compare.png")


def score(page: PlaygroundPage, out: Path) -> None:
    page.open()
    page.set_mode("score")
    page.choose_model("shakespeare-lstm")
    page.fill("prompt", RICHARD)
    page.run()
    page.wait_idle()
    page.driver.find_element("css selector", ".card-foot details summary").click()
    hover_token(page, 3)
    shoot(page, out / "score.png")


def phone(page: PlaygroundPage, out: Path) -> None:
    set_viewport(page.driver, PHONE_VIEW, mobile=True)
    page.open()
    page.choose_model("shakespeare-gcnn")
    page.fill("prompt", "KING HENRY:")
    page.run()
    page.wait_idle()
    page.token_spans()[6].click()  # a tap pins the tip
    page.wait(page.tip, "the alternatives tip")
    shoot(page, out / "phone.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/playground"), help="folder for the PNG files")
    args = parser.parse_args(argv)
    missing = missing_browser()
    if missing:
        print(f"the screenshots need {missing}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    models = {name: str(BUNDLED_DIR / name) for name in DEFAULT_MODELS}
    server = LiveServer(models, "--cache-bytes", str(64 * 2**20))  # room for four panes, beams included
    driver = None
    try:
        server.wait_ready()
        driver = start_browser()
        page = PlaygroundPage(driver, server.url, timeout=180)
        set_viewport(driver, DESKTOP_VIEW)
        for take in (generate, compare, score, phone):
            take(page, args.out)
    finally:
        if driver is not None:
            driver.quit()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
