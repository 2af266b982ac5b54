"""The checks both dialects share: the server's limits, named in each dialect's own words, and the
sampling settings turned into 400s. Unit tests need no model; the last ones ask both dialects."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from quill.server.api.errors import APIError
from quill.server.api.validation import (build_params, check_beam_width, check_max_tokens, check_num_samples,
                                         check_stop, check_top_k, parse_logit_bias, stop_strings)
from quill.server.config import ServerConfig

CONFIG = ServerConfig(max_tokens_limit=100, max_n=4, max_beam_width=3, max_stop_strings=2, max_stop_string_chars=5)
HOSTED = SimpleNamespace(loaded=SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=50)),
                                               generation_defaults={}))


def refusal(check, *args) -> APIError:
    with pytest.raises(APIError) as error:
        check(*args)
    assert error.value.status == 400 and error.value.reason == "invalid_request"
    return error.value


@pytest.mark.parametrize("check, limit", [(check_max_tokens, 100), (check_num_samples, 4), (check_beam_width, 3)])
def test_counts_must_be_between_one_and_the_limit(check, limit):
    check(CONFIG, 1, "x")
    check(CONFIG, limit, "x")
    for value in (0, -1, limit + 1):
        error = refusal(check, CONFIG, value, "num_beams")
        assert error.param == "num_beams" and error.message.startswith("num_beams")
        assert f"between 1 and {limit}, got {value}" in error.message


def test_stop_strings_are_bounded_in_number_and_length():
    check_stop(CONFIG, ["ab", "cdefg"])
    assert "at most 2 sequences, got 3" in refusal(check_stop, CONFIG, ["a", "b", "c"]).message
    for stop in (["abcdef"], [""]):
        error = refusal(check_stop, CONFIG, stop)
        assert error.param == "stop" and "1 to 5 characters" in error.message


def test_openai_stop_logit_bias_and_top_k_forms():
    assert stop_strings(CONFIG, "ab") == ["ab"] and stop_strings(CONFIG, None) == []
    assert refusal(stop_strings, CONFIG, ["a", "b", "c"]).param == "stop"
    assert parse_logit_bias({"7": -1.5}) == {7: -1.5} and parse_logit_bias({}) is None
    assert refusal(parse_logit_bias, {"seven": 1.0}).param == "logit_bias"
    check_top_k(-1)
    check_top_k(None)
    assert refusal(check_top_k, 0).param == "top_k"


def test_sampling_settings_become_400_naming_the_setting():
    assert build_params(HOSTED, temperature=0.5, logit_bias={49: 1.0}).temperature == 0.5
    assert refusal(lambda: build_params(HOSTED, top_p=2.0)).param == "top_p"
    error = refusal(lambda: build_params(HOSTED, stop_token_ids=[50]))
    assert error.param == "stop_token_ids" and "vocab size (50)" in error.message


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 100000}}, "max_new_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 17}, "stop"),
    ("/generate", {"inputs": "x", "parameters": {"stop": ["s"] * 17}}, "stop"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "best_of": 9}, "best_of"),
    ("/generate", {"inputs": "x", "parameters": {"num_beams": 9}}, "num_beams"),
])
async def test_both_dialects_refuse_the_same_limits_in_their_own_words(client, route, body, param):
    r = await client.post(route, json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"] if route.startswith("/v1/") else r.json()["error"]
    assert message.startswith(param)
