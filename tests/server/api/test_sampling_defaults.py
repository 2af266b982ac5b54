"""Settings a request leaves out take the checkpoint's generation_config.json recommendations
(vLLM's --generation-config auto), in every dialect; settings it gives win; `none` drops them.
The unit tests need no model; the others read the SamplingParams each route hands the engine."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.api.sampling_defaults import default_max_tokens, fill_sampling_settings
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost

LLAMA = "quill-test/tiny-llama-chat"  # recommends temperature 0.6, top_p 0.9, max_new_tokens 64
RECOMMENDED = dict(temperature=0.6, top_p=0.9, max_tokens=64)


def hosted(defaults: dict, max_model_len: int = 100):
    return SimpleNamespace(loaded=SimpleNamespace(generation_defaults=defaults), max_model_len=max_model_len)


def test_left_out_settings_take_the_recommendation_given_ones_win():
    model = hosted({"temperature": 0.6, "top_k": 20, "max_tokens": 64})
    assert fill_sampling_settings(model, dict(temperature=None, top_k=None, top_p=None, seed=None, n=2)) == \
        dict(temperature=0.6, top_k=20, n=2)  # top_p and seed: left to SamplingParams' defaults
    assert fill_sampling_settings(model, dict(temperature=0.0, top_k=5)) == dict(temperature=0.0, top_k=5)
    # Beam search ranks raw log-probabilities: no recommended sampling settings.
    assert fill_sampling_settings(model, dict(temperature=None, use_beam_search=True)) == dict(use_beam_search=True)
    assert fill_sampling_settings(hosted({}), dict(temperature=None)) == {}


def test_default_max_tokens_never_fails_a_prompt_that_fits():
    config = ServerConfig(max_tokens_limit=50)
    assert default_max_tokens(hosted({"max_tokens": 40}), config, 10) == 40
    assert default_max_tokens(hosted({"max_tokens": 400}), config, 10) == 50  # the server's limit
    assert default_max_tokens(hosted({"max_tokens": 40}), config, 90) == 10  # what the context leaves
    assert default_max_tokens(hosted({}), config, 10, fallback=16) == 16
    assert default_max_tokens(hosted({}), config, 70) == 30  # no recommendation, no fallback: all that is left
    assert default_max_tokens(hosted({}), config, 100) == 1  # nothing left: the context check refuses it


@pytest.fixture(scope="module")
def apps(hub_cache):
    """generation-config mode -> (app, the SamplingParams its engine was handed, in order)."""
    out = {}
    for mode in ("auto", "none"):
        config = ServerConfig(models=[f"llama={hub_cache[1][LLAMA].path}"], device="cpu", dtype="float32",
                              cache_bytes=4 * 2**20, block_size=4, max_tokens_limit=256, generation_config=mode)
        host = ModelHost.load(config)
        host.start()
        engine, submitted = host.models["llama"].engine, []
        submit = engine.submit

        def spy(prompt_ids, params, request_id=None, submit=submit, submitted=submitted):
            submitted.append(params)
            return submit(prompt_ids, params, request_id)

        engine.submit = spy
        out[mode] = create_app(host, config), submitted
    yield out
    for app, _ in out.values():
        app.state.host.shutdown()


async def submitted_params(apps, mode: str, route: str, body: dict):
    app, submitted = apps[mode]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test",
                                 timeout=30) as client:
        r = await client.post(route, json=body)
    assert r.status_code == 200, r.text
    return submitted[-1]


def settings(params) -> dict:
    return dict(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens)


async def test_completions(apps):
    left_out = await submitted_params(apps, "auto", "/v1/completions", {"prompt": "To be"})
    assert settings(left_out) == RECOMMENDED and left_out.top_k == -1  # not recommended: Quill's default
    given = await submitted_params(apps, "auto", "/v1/completions",
                                   {"prompt": "To be", "temperature": 1.2, "top_p": 1.0, "max_tokens": 3})
    assert settings(given) == dict(temperature=1.2, top_p=1.0, max_tokens=3)
    beams = await submitted_params(apps, "auto", "/v1/completions",
                                   {"prompt": "To be", "use_beam_search": True, "best_of": 2, "max_tokens": 3})
    assert (beams.temperature, beams.top_p) == (1.0, 1.0)
    off = await submitted_params(apps, "none", "/v1/completions", {"prompt": "To be"})
    assert settings(off) == dict(temperature=1.0, top_p=1.0, max_tokens=16)  # OpenAI's 16


async def test_tgi_stays_greedy_unless_sampling_and_then_samples_as_recommended(apps):
    greedy = await submitted_params(apps, "auto", "/generate", {"inputs": "To be"})
    assert greedy.is_greedy and greedy.max_tokens == 64
    sampled = await submitted_params(apps, "auto", "/generate", {"inputs": "To be", "parameters": {"do_sample": True}})
    assert settings(sampled) == RECOMMENDED
    given = await submitted_params(apps, "auto", "/generate",
                                   {"inputs": "To be", "parameters": {"temperature": 1.5, "max_new_tokens": 2}})
    assert (given.temperature, given.top_p, given.max_tokens) == (1.5, 0.9, 2)
    off = await submitted_params(apps, "none", "/generate", {"inputs": "To be", "parameters": {"do_sample": True}})
    room = 128 - len(apps["none"][0].state.host.models["llama"].tokenizer.encode("To be"))
    assert (off.temperature, off.top_p, off.max_tokens) == (1.0, 1.0, room)  # all the context leaves


async def test_chat(apps):
    messages = [{"role": "user", "content": "To be"}]
    left_out = await submitted_params(apps, "auto", "/v1/chat/completions", {"messages": messages})
    assert settings(left_out) == RECOMMENDED
    given = await submitted_params(apps, "auto", "/v1/chat/completions", {
        "messages": messages, "temperature": 0, "top_p": 0.5, "max_completion_tokens": 4})
    assert settings(given) == dict(temperature=0.0, top_p=0.5, max_tokens=4)
    off = await submitted_params(apps, "none", "/v1/chat/completions", {"messages": messages, "ignore_eos": True})
    hosted = apps["none"][0].state.host.models["llama"]
    room = 128 - len(hosted.tokenizer.encode(hosted.chat_template.render(messages), add_special_tokens=False))
    assert settings(off) == dict(temperature=1.0, top_p=1.0, max_tokens=room)  # all the context leaves, as vLLM
