"""The playground's chat mode in a real headless browser: a model with a chat template offers Chat, the
reply streams through /v1/chat/completions with its tokens coloured, and equals what that route answers;
a model without a template offers only a prompt.

Skipped, naming what to install, without Debian's chromium and chromium-driver (or selenium).
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import LiveServer
from tests.server.api.playground_page import DESKTOP, PlaygroundPage, missing_browser, start_browser

MISSING = missing_browser()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"the browser tests need {MISSING}")

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
QUESTION = "Whether 'tis nobler in the mind to suffer"


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    with LiveServer(tiny_checkpoints, "--chat-template", f"tiny-transformer={template}") as live:
        yield live


@pytest.fixture(scope="module")
def page(server):
    driver = start_browser(DESKTOP)
    try:
        yield PlaygroundPage(driver, server.url).open()
    finally:
        driver.quit()


def shown(page: PlaygroundPage, element_id: str) -> bool:
    return page.js(f"return !document.getElementById('{element_id}').hidden")


def test_a_chat_model_streams_its_reply_through_the_chat_route(page, server):
    page.choose_model("tiny-transformer")
    assert shown(page, "kind-switch") and shown(page, "chat-box") and not shown(page, "prompt-box")
    for remove in page.driver.find_elements("css selector", "#messages .remove"):  # the page's example chat
        remove.click()
    page.element("add-message").click()  # one user message: the tiny model's context is 64 tokens
    page.driver.find_element("css selector", "#messages textarea").send_keys(QUESTION)
    card = page.greedy_card(max_tokens=8, alternatives=2)
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny-transformer", "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    expected = r.json()
    assert card["state"] == "done" and card["error"] is None, card
    assert card["texts"] == [expected["choices"][0]["message"]["content"]]
    assert len(page.token_bands()) == expected["usage"]["completion_tokens"]
    assert set(page.token_bands()) <= {"p0", "p1", "p2", "p3", "p4"}  # every token carries its probability


def test_a_model_without_a_template_offers_a_prompt_only(page):
    page.choose_model("tiny-lstm")
    assert not shown(page, "kind-switch") and not shown(page, "chat-box") and shown(page, "prompt-box")


def test_a_beam_pane_asks_the_chat_route_for_its_beams(page, server):
    """The page's beam width is completions' best_of; the chat route, which refuses best_of, gets it as n
    (every beam answered) and, as it gives none with beam search, is not asked for log-probabilities."""
    page.choose_model("tiny-transformer")
    for remove in page.driver.find_elements("css selector", "#messages .remove"):
        remove.click()
    page.element("add-message").click()
    page.driver.find_element("css selector", "#messages textarea").send_keys(QUESTION)
    page.set_mode("compare")
    page.fill("max_tokens", 6)
    page.fill("alternatives", 2)
    page.set_panes({"temperature": 0}, {"use_beam_search": True, "best_of": 2, "temperature": 0})
    page.run()
    page.wait_idle()
    greedy, beams = page.cards()
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny-transformer", "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 6, "use_beam_search": True, "n": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert greedy["state"] == "done" and greedy["error"] is None, greedy
    assert beams["state"] == "done" and beams["error"] is None, beams
    assert beams["texts"] == [c["message"]["content"] for c in r.json()["choices"]]
