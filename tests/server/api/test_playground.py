"""The playground in a real headless browser against a live server over the tiny checkpoints: streaming
from every model with coloured tokens and their alternatives, greedy and beam search side by side
equal to what /v1/completions answers, Stop freeing the cache, the server's own error messages, the
API key, scoring, a phone-sized screen, a page opened while the models still load, a constrained answer
whose tips strike through the alternatives its grammar forbade, and encoder-decoder (translation) models with
their source and target languages.

Skipped, naming what to install, without Debian's chromium and chromium-driver (or selenium).
The chat mode is tested in test_playground_chat.py.
"""

from __future__ import annotations

import json
import math
import re
import time

import httpx
import pytest

from quill.server.api.generation import LOADING_RETRY_AFTER_SECONDS
from tests.conftest import TEXT, LiveServer, free_port
from tests.server.api.conftest import server_config
from tests.server.api.held_server import HeldLoadServer
from tests.server.api.playground_page import DESKTOP, PHONE, PlaygroundPage, missing_browser, start_browser

MISSING = missing_browser()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"the browser tests need {MISSING}")

KEY = "sk-playground-test-key"
LONG = 4000  # tokens: a stream that is still running when Stop is pressed (the tiny LSTM's context is 4096)


def visible(text: str) -> str:
    """How the page shows a token's text on its own."""
    return (text or "∅").replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


def completion(server: LiveServer, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def metrics(server: LiveServer, model: str,
            names=("quill_cache_usage_ratio", "quill_num_requests_running")) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    found = {}
    for name in names:
        match = re.search(rf'^{name}{{model="{re.escape(model)}"}} (\S+)$', text, re.M)
        found[name] = float(match.group(1))
    return found


@pytest.fixture(scope="module")
def server(tiny_checkpoints):
    with LiveServer(tiny_checkpoints, "--max-tokens-limit", str(LONG)) as live:
        yield live


@pytest.fixture(scope="module")
def browser():
    driver = start_browser(DESKTOP)
    yield driver
    driver.quit()


def assert_no_page_errors(page: PlaygroundPage) -> None:
    """No script error on the page (refused requests log their status as console errors: those are expected)."""
    errors = [e for e in page.console_errors() if "Failed to load resource" not in e]
    assert not errors, errors


@pytest.fixture
def page(browser, server):
    browser.set_window_size(*DESKTOP)
    playground = PlaygroundPage(browser, server.url).open()
    yield playground
    assert_no_page_errors(playground)


def test_streams_from_every_model_with_coloured_tokens_and_alternatives(page, server):
    assert page.models() == ["tiny-transformer", "tiny-lstm", "tiny-gcnn"]
    prompt = TEXT[0]
    for model in page.models():
        page.choose_model(model)
        page.fill("prompt", prompt)
        card = page.greedy_card(max_tokens=12, alternatives=3)
        expected = completion(server, model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
        assert card["state"] == "done" and card["error"] is None, card
        assert card["texts"] == [expected["choices"][0]["text"]], model
        assert re.search(r"TTFT \d+ ms · \d+ tokens · [\d.]+ tokens/s", card["stats"]), card["stats"]
        bands = page.token_bands()
        assert len(bands) == expected["usage"]["completion_tokens"] and set(bands) <= {"p0", "p1", "p2", "p3", "p4"}

        from selenium.webdriver import ActionChains

        ActionChains(page.driver).move_to_element(page.token_spans()[0]).perform()
        tip = page.wait(page.tip, "the alternatives of the first token")
        top = sorted(expected["choices"][0]["logprobs"]["top_logprobs"][0].items(), key=lambda kv: -kv[1])
        assert len(tip["alternatives"]) == len(top)
        for line, (text, _) in zip(tip["alternatives"], top):
            assert line.startswith(visible(text)), (line, text)
        ActionChains(page.driver).move_by_offset(0, 400).perform()  # off the token: the tip goes away
        page.wait(lambda: page.tip() is None, "the tip to hide")
    requests = page.js("return performance.getEntriesByType('resource').map(e => e.name)")
    assert requests and all(url.startswith(server.url + "/") for url in requests), requests


def test_side_by_side_greedy_and_beam_equal_the_api(page, server):
    model, prompt = "tiny-transformer", TEXT[1]
    panes = [{"temperature": 0}, {"use_beam_search": True, "best_of": 4, "temperature": 0}]
    page.set_mode("compare")
    page.choose_model(model)
    page.fill("prompt", prompt)
    page.fill("max_tokens", 10)
    page.set_panes(*panes)
    page.run()
    page.wait_idle()
    cards = page.cards()
    assert [c["title"] for c in cards] == ["Greedy", "Beam 4"]
    for card, settings in zip(cards, panes):
        expected = completion(server, model=model, prompt=prompt, max_tokens=10, **settings)
        assert card["state"] == "done" and card["texts"] == [expected["choices"][0]["text"]], (card, settings)
    boxes = page.js("return [...document.querySelectorAll('#outputs .card')].map(c => c.getBoundingClientRect().top)")
    assert boxes[0] == boxes[1]  # side by side, not one under the other


def test_stop_aborts_the_stream_and_frees_the_cache(page, server):
    model = "tiny-lstm"
    page.choose_model(model)
    page.fill("prompt", TEXT[2])
    page.fill("max_tokens", LONG)
    page.element("ignore_eos").click()
    page.run()
    page.wait(lambda: page.cards() and page.cards()[0]["tokens"] >= 5, "the first tokens")
    page.wait(lambda: metrics(server, model)["quill_cache_usage_ratio"] > 0, "the request to hold cache", 10)
    page.stop()
    page.wait_idle()
    [card] = page.cards()
    assert card["state"] == "stopped" and "stopped" in card["stats"]
    assert card["tokens"] < LONG
    page.wait(lambda: metrics(server, model) == {"quill_cache_usage_ratio": 0.0, "quill_num_requests_running": 0.0},
              "the cache to be freed", 10)
    # Aborted, not left running unread: the model generates nothing more.
    generated = metrics(server, model, ["quill_generation_tokens_total"])
    time.sleep(0.5)
    assert metrics(server, model, ["quill_generation_tokens_total"]) == generated


def test_a_bad_setting_shows_the_servers_message(page, server):
    page.choose_model("tiny-gcnn")
    page.fill("max_tokens", 5)
    page.fill("top_p", 0)
    page.run()
    page.wait_idle()
    [card] = page.cards()
    body = {"model": "tiny-gcnn", "prompt": page.element("prompt").get_attribute("value"), "max_tokens": 5,
            "top_p": 0, "stream": True}
    answer = httpx.post(f"{server.url}/v1/completions", json=body)
    assert answer.status_code == 400
    assert card["state"] == "error" and card["error"] == f"400 {answer.json()['error']['message']}"


def test_score_shows_per_token_logprobs_and_perplexity(page, server):
    model, text = "tiny-gcnn", " ".join(TEXT[:2])
    page.set_mode("score")
    page.choose_model(model)
    page.fill("prompt", text)
    page.run()
    page.wait_idle()
    [card] = page.cards()
    answer = completion(server, model=model, prompt=text, max_tokens=1, echo=True, logprobs=5)
    num_prompt = answer["usage"]["prompt_tokens"]
    logprobs = answer["choices"][0]["logprobs"]["token_logprobs"][:num_prompt]
    scored = [lp for lp in logprobs if lp is not None]
    assert card["state"] == "done" and card["tokens"] == num_prompt
    assert card["texts"] == ["".join(answer["choices"][0]["logprobs"]["tokens"][:num_prompt])]
    assert math.isclose(float(card["perplexity"]), math.exp(-sum(scored) / len(scored)), rel_tol=1e-9)
    assert f"perplexity {math.exp(-sum(scored) / len(scored)):.2f}" in card["stats"]
    assert page.token_bands()[0] == "pn"  # the first token has nothing before it
    rows = page.driver.find_elements("css selector", ".score-table tbody tr")
    assert len(rows) == num_prompt


def test_usable_on_a_phone_sized_screen(browser, server):
    browser.set_window_size(*PHONE)
    page = PlaygroundPage(browser, server.url).open()
    width = page.js("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], "the page scrolls sideways"
    assert not page.element("settings").get_attribute("open")  # the prompt and Run come first
    page.choose_model("tiny-lstm")
    page.driver.find_element("css selector", "#settings summary").click()  # open: the results start below the fold
    page.run()
    page.wait_idle()
    assert page.cards()[0]["state"] == "done"
    box = page.js("return document.querySelector('#outputs .card').getBoundingClientRect().toJSON()")
    assert box["top"] < page.js("return innerHeight") and box["bottom"] > 0, "the result is out of sight"
    page.token_spans()[0].click()  # a tap pins the tip
    tip = page.wait(page.tip, "the alternatives after a tap")
    assert 0 <= tip["left"] and tip["right"] <= PHONE[0]
    # Scrolling keeps a pinned tip, under its token wherever that goes (a tap that scrolls as it lands lost it).
    token_top = page.js("return document.querySelector('#outputs .tok').getBoundingClientRect().top")
    page.js("window.scrollBy(0, 20)")
    page.wait(lambda: page.js("return document.querySelector('#outputs .tok').getBoundingClientRect().top")
              != token_top, "the page to scroll")
    moved = page.wait(lambda: (now := page.tip()) and now["top"] != tip["top"] and now, "the tip to follow its token")
    assert tip["top"] - moved["top"] == pytest.approx(20, abs=1)
    width = page.js("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], "the results scroll sideways"
    assert_no_page_errors(page)


def test_a_page_opened_while_the_models_load_lists_them_once_loaded(browser, tiny_checkpoints):
    lstm = {"tiny-lstm": tiny_checkpoints["tiny-lstm"]}
    with HeldLoadServer(server_config(lstm, port=free_port())) as held:
        browser.set_window_size(*DESKTOP)
        page = PlaygroundPage(browser, held.url).open(expect_models=False)
        page.wait(page.page_error, "the refusal of /v1/models")
        assert page.page_error().startswith("503 the models are still loading")
        assert page.element("run").get_attribute("disabled")
        held.release()
        # The page asks again after the Retry-After of the refusal, without a reload.
        assert page.wait(page.models, "the models, once loaded", timeout=LOADING_RETRY_AFTER_SECONDS + 30) == [
            "tiny-lstm"]
        assert page.page_error() is None and not page.element("run").get_attribute("disabled")
        assert_no_page_errors(page)


def test_api_key_from_the_page(browser, tiny_checkpoints):
    keyed = LiveServer({"tiny-lstm": tiny_checkpoints["tiny-lstm"]}, "--api-key", KEY)
    try:
        keyed.wait_ready()
        browser.set_window_size(*DESKTOP)
        page = PlaygroundPage(browser, keyed.url).open(expect_models=False)
        page.wait(page.page_error, "the refusal of /v1/models")
        assert page.page_error().startswith("401 missing or invalid API key")
        assert page.element("key-box").get_attribute("open")
        page.element("api-key").send_keys(KEY)
        page.element("key-use").click()
        assert page.wait(page.models, "the models, with the key") == ["tiny-lstm"]
        page.fill("max_tokens", 4)
        page.run()
        page.wait_idle()
        assert page.cards()[0]["state"] == "done"
        assert KEY not in browser.current_url and page.element("api-key").get_attribute("value") == ""
        assert page.js("return sessionStorage.getItem('quill-playground-api-key')") == KEY
        page.open()  # a reload keeps the key for this tab
        page.element("key-box").click()
        page.element("key-forget").click()
        page.wait(page.page_error, "the refusal once the key is forgotten")
        assert page.js("return sessionStorage.length") == 0
        assert_no_page_errors(page)
    finally:
        keyed.stop()


def test_a_constrained_answer_and_the_alternatives_its_grammar_forbade(page, server):
    from selenium.webdriver import ActionChains
    from selenium.webdriver.support.ui import Select

    page.choose_model("tiny-transformer")
    page.fill("prompt", TEXT[0])
    page.fill("max_tokens", 20)
    page.preset("greedy")
    page.fill("alternatives", 5)
    Select(page.element("constraint_kind")).select_by_value("regex")
    page.fill("constraint", "(to|be) [a-z]{1,3}")
    page.run()
    page.wait_idle()
    [card] = page.cards()
    assert card["state"] == "done" and re.fullmatch("(to|be) [a-z]{1,3}", card["texts"][0]), card
    ActionChains(page.driver).move_to_element(page.token_spans()[0]).perform()
    notes = lambda: page.js("return [...document.querySelectorAll('#tip .grammar')].map(p => p.textContent)")
    [note] = page.wait(notes, "the grammar's note on the first token")
    assert re.match(r"the grammar allowed \d+ of \d+ tokens here", note), note
    forbidden = page.js("return [...document.querySelectorAll('#tip li.forbidden code')].map(c => c.textContent)")
    assert all(not re.match(r"(t|to|b|be)$", text) for text in forbidden), forbidden
    Select(page.element("constraint_kind")).select_by_value("")  # the next tests run unconstrained


def test_an_encoder_decoder_model_translates_into_the_language_picked(browser, tiny_checkpoints, tmp_path):
    from selenium.webdriver.support.ui import Select

    from tests.seq2seq_models import write_checkpoint

    write_checkpoint(tmp_path / "m2m", "m2m_100")  # needs a source and a target language
    write_checkpoint(tmp_path / "marian", "marian")  # one pair, no language tokens
    hosted = {"tiny-m2m": str(tmp_path / "m2m"), "tiny-marian": str(tmp_path / "marian"),
              "tiny-lstm": tiny_checkpoints["tiny-lstm"]}
    source = "The house is small and the garden was green."
    with LiveServer(hosted) as live:
        listed = {m["id"]: m for m in httpx.get(f"{live.url}/v1/models").json()["data"]}
        browser.set_window_size(*DESKTOP)
        page = PlaygroundPage(browser, live.url).open()
        shown = lambda element_id: page.js(f"return !document.getElementById('{element_id}').hidden")
        sent = lambda: json.loads(page.js("return document.getElementById('request-view').textContent")
                                  .split("\n\n")[0].split("\n", 1)[1])
        page.choose_model("tiny-lstm")
        assert not shown("seq2seq-box") and page.element("prompt-label").text == "Prompt"

        page.choose_model("tiny-m2m")
        assert shown("seq2seq-box") and shown("lang-box") and not shown("kind-switch")
        assert page.element("prompt-label").text == "Source text"
        codes = listed["tiny-m2m"]["languages"]
        assert {"en", "fr", "de"} <= set(codes)
        for select in ("source_lang", "target_lang"):
            assert page.js(f"return [...document.querySelectorAll('#{select} option')].map(o => o.value)") == [
                "", *codes]
        Select(page.element("source_lang")).select_by_value("en")
        Select(page.element("target_lang")).select_by_value("fr")
        page.fill("prompt", source)
        card = page.greedy_card(max_tokens=8, alternatives=2)
        expected = completion(live, model="tiny-m2m", prompt=source, max_tokens=8, temperature=0, source_lang="en",
                              target_lang="fr")
        assert card["state"] == "done" and card["error"] is None, card
        assert card["texts"] == [expected["choices"][0]["text"]] and card["tokens"] > 0
        assert card["title"] == "tiny-m2m · en → fr"
        assert page.js("return document.querySelectorAll('#outputs .echo').length") == 0  # not a continuation
        assert {k: sent()[k] for k in ("model", "prompt", "source_lang", "target_lang")} == {
            "model": "tiny-m2m", "prompt": source, "source_lang": "en", "target_lang": "fr"}

        # Unset, a language is left out of the body: this checkpoint needs a target, and the server says so.
        Select(page.element("target_lang")).select_by_value("")
        page.run()
        page.wait_idle()
        [card] = page.cards()
        assert "target_lang" not in sent() and sent()["source_lang"] == "en"
        assert card["state"] == "error" and card["error"].startswith("400 this checkpoint needs a target language")

        # No language tokens: no selectors, and the body names none.
        page.choose_model("tiny-marian")
        assert listed["tiny-marian"]["languages"] == [] and listed["tiny-marian"]["encoder_decoder"] is True
        assert shown("seq2seq-box") and not shown("lang-box") and not shown("kind-switch")
        assert "no language codes" in page.element("seq2seq-note").text
        page.run()
        page.wait_idle()
        [card] = page.cards()
        expected = completion(live, model="tiny-marian", prompt=source, max_tokens=8, temperature=0)
        assert card["state"] == "done" and card["texts"] == [expected["choices"][0]["text"]], card
        assert card["title"] == "tiny-marian · source text" and not {"source_lang", "target_lang"} & set(sent())
        assert_no_page_errors(page)
