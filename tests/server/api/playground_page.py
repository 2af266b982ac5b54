"""The playground page in a headless Chromium (selenium, Debian's chromium and chromium-driver): the
browser, and the page's controls by what they do. Shared by the browser tests and the command that
takes the screenshots in docs/playground/."""

from __future__ import annotations

import json
import os
import shutil
import time

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DESKTOP = (1280, 900)
PHONE = (390, 844)  # CSS pixels of a common phone


def missing_browser() -> str | None:
    """What to install for the browser tests, or None when everything is there."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the Python package selenium (pip install -e '.[test]')"
    absent = [package for package, path in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
              if not os.access(path, os.X_OK) and shutil.which(os.path.basename(path)) is None]
    if absent:
        return f"the Debian package{'s' if len(absent) > 1 else ''} {' and '.join(absent)} (apt-get install {' '.join(absent)})"
    return None


def start_browser(size: tuple[int, int] = DESKTOP):
    """Headless Chromium with its console log readable (the tests fail on page errors)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={size[0]},{size[1]}", "--force-device-scale-factor=1", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if os.access(CHROMEDRIVER, os.X_OK) else shutil.which("chromedriver")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_window_size(*size)
    return driver


class PlaygroundPage:
    """One browser tab on /playground of a server at `url`."""

    def __init__(self, driver, url: str, timeout: float = 60.0):
        self.driver = driver
        self.url = url
        self.timeout = timeout

    # ---- waiting ----

    def wait(self, condition, what: str, timeout: float | None = None):
        """Poll `condition()` until it returns something truthy; fail saying `what` was awaited."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; page error: {self.page_error()!r}")
            time.sleep(0.05)

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    # ---- loading ----

    def open(self, expect_models: bool = True) -> "PlaygroundPage":
        self.driver.get(f"{self.url}/playground")
        self.wait(lambda: self.js("return document.readyState") == "complete", "the page to load")
        if expect_models:
            self.wait(lambda: self.models(), "the model list")
        return self

    def models(self) -> list[str]:
        return self.js("return [...document.querySelectorAll('#model option')].map(o => o.value)")

    def console_errors(self) -> list[str]:
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    # ---- controls ----

    def element(self, element_id: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def choose_model(self, name: str) -> None:
        from selenium.webdriver.support.ui import Select

        Select(self.element("model")).select_by_value(name)

    def set_mode(self, mode: str) -> None:
        self.driver.find_element("css selector", f'.modes [data-mode="{mode}"]').click()

    def fill(self, element_id: str, value) -> None:
        """Type into a field, replacing what it held."""
        field = self.element(element_id)
        field.clear()
        if value is not None and value != "":
            field.send_keys(str(value))

    def preset(self, name: str) -> None:
        self.driver.find_element("css selector", f'[data-preset="{name}"]').click()

    def set_panes(self, *settings: dict) -> None:
        """Compare mode: exactly these panes, each given its settings as JSON."""
        add = self.element("add-pane")
        while self.js("return document.getElementById('pane-settings').children.length") < len(settings):
            add.click()
        while self.js("return document.getElementById('pane-settings').children.length") > len(settings):
            self.js("document.querySelector('#pane-settings .pane-setting:last-child').remove()")
        rows = self.driver.find_elements("css selector", "#pane-settings .pane-setting input")
        for row, value in zip(rows, settings):
            row.clear()
            row.send_keys(json.dumps(value))

    def run(self) -> None:
        self.element("run").click()

    def stop(self) -> None:
        self.element("stop-run").click()

    def wait_idle(self, timeout: float | None = None) -> None:
        self.wait(lambda: self.js("return document.body.dataset.busy") == "", "the request to finish", timeout)

    def greedy_card(self, max_tokens: int, alternatives: int) -> dict:
        """Run the page's input greedily, `alternatives` shown per token, and read the one result card."""
        self.fill("max_tokens", max_tokens)
        self.preset("greedy")
        self.fill("alternatives", alternatives)
        self.run()
        self.wait_idle()
        [card] = self.cards()
        return card

    # ---- reading results ----

    def cards(self) -> list[dict]:
        """Each result card: title, state, stats, error, and each choice's generated text."""
        return self.js("""
            return [...document.querySelectorAll('#outputs .card')].map(card => ({
                title: card.querySelector('h2').textContent,
                state: card.dataset.state,
                stats: card.querySelector('.stats').textContent,
                error: card.querySelector('.card-error').hidden ? null : card.querySelector('.card-error').textContent,
                texts: [...card.querySelectorAll('.choice .gen')].map(g => g.textContent),
                tokens: card.querySelectorAll('.tok').length,
                perplexity: card.dataset.perplexity ?? null,
            }));""")

    def token_spans(self):
        return self.driver.find_elements("css selector", "#outputs .tok")

    def token_bands(self) -> list[str]:
        return self.js("return [...document.querySelectorAll('#outputs .tok')]"
                       ".map(t => [...t.classList].find(c => /^p[0-4n]$/.test(c)))")

    def tip(self) -> dict | None:
        """The alternatives tip when shown: its lines and its box."""
        return self.js("""
            const tip = document.getElementById('tip');
            if (tip.hidden) return null;
            const box = tip.getBoundingClientRect();
            return {alternatives: [...tip.querySelectorAll('li')].map(li => li.textContent),
                    head: tip.querySelector('p').textContent, left: box.left, right: box.right, top: box.top};""")

    def page_error(self) -> str | None:
        try:
            return self.js("const e = document.getElementById('error'); return e && !e.hidden ? e.textContent : null")
        except Exception:  # no page yet
            return None

    def server_gauges(self) -> str:
        return self.element("server-state").text
