"""The text-generation-inference dialect in process: /generate, /generate_stream and /, every bad input; /info."""

from __future__ import annotations

import json

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.engine.process.frontend import EngineDeadError, RequestStream
from quill.server.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from quill.server.engine.scheduler import QueueFullError
from tests.conftest import TEST_DEVICE
from tests.server.api.conftest import TINY, server_config

MODELS = list(TINY)
ROUTES = ["/generate", "/generate_stream", "/"]
FINISH_REASONS = {"length", "eos_token", "stop_sequence"}


def sse_events(text: str) -> list[dict]:
    events = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data:"), block
        events.append(json.loads(block[len("data:"):]))
    return events


SPECIAL_TEXTS = {0: "<|endoftext|>"}  # the tiny models' one special token (tests.conftest.build_hf_tokenizer)


def visible_text(tokens: list[dict]) -> str:
    """What TGI's generated_text holds: every token's text but the special ones' own. What a special token's
    text carries before its own is what the tokens before it held back: a character they left unfinished, which
    the special token ends (shown as U+FFFD)."""
    texts = []
    for t in tokens:
        if t["special"]:
            own = SPECIAL_TEXTS[t["id"]]
            assert t["text"].endswith(own), t
            texts.append(t["text"].removesuffix(own))
        else:
            texts.append(t["text"])
    return "".join(texts)


async def generate(client, inputs="To be, or not", route="/generate", model=None, stream=None, **parameters):
    body = {"inputs": inputs, "parameters": parameters}
    if model is not None:
        body["model"] = model
    if stream is not None:
        body["stream"] = stream
    return await client.post(route, json=body)


async def stream_events(client, route="/generate_stream", **kwargs) -> list[dict]:
    r = await generate(client, route=route, **kwargs)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return sse_events(r.text)


def assert_token(token: dict) -> None:
    assert set(token) == {"id", "text", "logprob", "special"}
    assert isinstance(token["id"], int) and isinstance(token["text"], str) and isinstance(token["special"], bool)
    assert token["logprob"] is None or token["logprob"] <= 0


def assert_stream(events: list[dict], details: bool) -> None:
    """Token events numbered from 1; only the last carries generated_text, which its tokens spell out."""
    assert [e["index"] for e in events] == list(range(1, len(events) + 1))
    for e in events:
        assert set(e) == {"index", "token", "top_tokens", "generated_text", "details"}
        assert_token(e["token"])
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    last = events[-1]
    assert last["generated_text"] == visible_text([e["token"] for e in events])
    if details:
        assert last["details"]["finish_reason"] in FINISH_REASONS
        assert last["details"]["generated_tokens"] == len(events)
        assert set(last["details"]) == {"finish_reason", "generated_tokens", "seed", "input_length"}
    else:
        assert last["details"] is None


# ---- /generate -------------------------------------------------------------------------------


async def test_generate_answers_text_only_unless_details_are_asked(client):
    r = await generate(client, max_new_tokens=5)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"generated_text"} and isinstance(r.json()["generated_text"], str)


async def test_details_describe_every_generated_token(client):
    r = await generate(client, max_new_tokens=7, details=True)
    data = r.json()
    details = data["details"]
    assert set(details) == {"finish_reason", "generated_tokens", "seed", "prefill", "tokens"}
    assert details["finish_reason"] == "length" and details["generated_tokens"] == 7
    assert details["seed"] is None  # greedy: TGI's default when do_sample is false
    assert details["prefill"] == []
    assert len(details["tokens"]) == 7
    for token in details["tokens"]:
        assert_token(token)
        assert token["logprob"] is not None
    assert data["generated_text"] == visible_text(details["tokens"])


async def test_greedy_is_the_default_and_is_deterministic(client):
    a = (await generate(client, inputs="the mind", max_new_tokens=8)).json()
    b = (await generate(client, inputs="the mind", max_new_tokens=8, do_sample=False)).json()
    assert a == b


async def test_top_n_tokens_rank_alternatives_and_greedy_picks_the_first(client):
    r = await generate(client, max_new_tokens=4, details=True, top_n_tokens=3)
    details = r.json()["details"]
    assert len(details["top_tokens"]) == 4
    for token, tops in zip(details["tokens"], details["top_tokens"]):
        assert len(tops) == 3
        for top in tops:
            assert_token(top)
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert tops[0]["id"] == token["id"]


async def test_decoder_input_details_score_the_prompt(client, app):
    prompt_ids = app.state.host.get(None).tokenizer.encode("To be, or not")
    r = await generate(client, max_new_tokens=2, decoder_input_details=True)
    prefill = r.json()["details"]["prefill"]  # decoder_input_details alone turns details on, as in TGI
    assert [t["id"] for t in prefill] == prompt_ids
    assert all(set(t) == {"id", "text", "logprob"} for t in prefill)
    assert prefill[0]["logprob"] is None and all(t["logprob"] <= 0 for t in prefill[1:])


async def test_truncate_keeps_the_end_of_the_prompt(client, app):
    prompt_ids = app.state.host.get(None).tokenizer.encode("To be, or not")
    r = await generate(client, max_new_tokens=2, decoder_input_details=True, truncate=3)
    assert [t["id"] for t in r.json()["details"]["prefill"]] == prompt_ids[-3:]


async def test_sampling_reports_its_seed_and_a_seed_reproduces(client):
    a = (await generate(client, max_new_tokens=8, do_sample=True, seed=7, details=True)).json()
    b = (await generate(client, max_new_tokens=8, do_sample=True, seed=7, details=True)).json()
    assert a == b and a["details"]["seed"] == 7
    c = (await generate(client, max_new_tokens=8, do_sample=True, details=True)).json()
    assert isinstance(c["details"]["seed"], int)  # chosen by the server, as TGI does
    replay = (await generate(client, max_new_tokens=8, do_sample=True, seed=c["details"]["seed"])).json()
    assert replay["generated_text"] == c["generated_text"]


async def test_a_sampling_setting_turns_sampling_on_even_without_do_sample(client):
    # TGI's rule: temperature, top_k or top_p given means sampling, whatever do_sample says.
    for setting in ({"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.9}):
        r = await generate(client, max_new_tokens=3, do_sample=False, details=True, **setting)
        assert r.status_code == 200, r.text
        assert isinstance(r.json()["details"]["seed"], int), setting


async def test_repetition_and_frequency_penalties_are_accepted(client):
    r = await generate(client, max_new_tokens=4, repetition_penalty=1.3, frequency_penalty=0.5, details=True)
    assert r.status_code == 200, r.text


async def test_stop_sequence_ends_generation_and_stays_in_the_text(client):
    # Greedy tiny-gcnn continues this prompt with " a`t a`t ...": stop where "`t" first completes.
    free = (await generate(client, model="tiny-gcnn", max_new_tokens=9)).json()["generated_text"]
    assert free.startswith(" a`t")
    r = await generate(client, model="tiny-gcnn", max_new_tokens=9, stop=["`t"], details=True)
    data = r.json()
    assert data["details"]["finish_reason"] == "stop_sequence"
    assert data["generated_text"] == " a`t"  # TGI keeps the stop sequence
    assert data["details"]["generated_tokens"] == 3


async def sampled_until_eos(send):
    """`send(seed)` -> (answer, its finish_reason), for seeds from 4 on until one stops before its 60 tokens:
    tiny-lstm's near-uniform distribution samples EOS (id 0) at step 24 with seed 4 on a CPU, but which seed does
    depends on the device's random numbers (CUDA's generator is not the CPU's)."""
    for seed in range(4, 44):
        answer, finish_reason = await send(seed)
        if finish_reason != "length":
            return answer
    pytest.fail("no seed from 4 to 43 sampled EOS within 60 tokens")


async def test_eos_token_finish_reason(client):
    async def send(seed):
        r = await generate(client, inputs="To be", model="tiny-lstm", max_new_tokens=60, do_sample=True, seed=seed,
                           details=True)
        return r, r.json()["details"]["finish_reason"]

    r = await sampled_until_eos(send)
    details = r.json()["details"]
    assert details["finish_reason"] == "eos_token"
    assert details["tokens"][-1]["id"] == 0 and details["tokens"][-1]["special"] is True
    assert details["generated_tokens"] == len(details["tokens"]) < 60
    assert "<|endoftext|>" not in r.json()["generated_text"]


async def test_return_full_text_prepends_the_inputs(client):
    plain = (await generate(client, max_new_tokens=4)).json()["generated_text"]
    full = (await generate(client, max_new_tokens=4, return_full_text=True)).json()["generated_text"]
    assert full == "To be, or not" + plain


async def test_best_of_returns_the_best_and_lists_the_others(client, tiny_tokenizer):
    r = await generate(client, max_new_tokens=5, do_sample=True, best_of=3, details=True)
    assert r.status_code == 200, r.text
    data = r.json()
    others = data["details"]["best_of_sequences"]
    assert len(others) == 2
    seeds = {data["details"]["seed"]} | {s["seed"] for s in others}
    assert len(seeds) == 3  # each sequence its own stream
    mean = lambda d: sum(t["logprob"] for t in d["tokens"]) / len(d["tokens"])  # noqa: E731
    for s in others:
        assert set(s) == {"generated_text", "finish_reason", "generated_tokens", "seed", "prefill", "tokens"}
        # The text of the ids (joined token texts can differ where random weights emit invalid UTF-8).
        assert s["generated_text"] == tiny_tokenizer.decode([t["id"] for t in s["tokens"]])
        assert mean(s) <= mean(data["details"]) + 1e-6


async def test_beam_search_via_num_beams(client):
    a = await generate(client, max_new_tokens=6, num_beams=3, details=True)
    assert a.status_code == 200, a.text
    details = a.json()["details"]
    assert details["finish_reason"] in FINISH_REASONS and 1 <= details["generated_tokens"] <= 6
    assert a.json()["generated_text"] == visible_text(details["tokens"])
    b = await generate(client, max_new_tokens=6, num_beams=3, length_penalty=0.5, early_stopping=True)
    assert b.status_code == 200, b.text
    again = await generate(client, max_new_tokens=6, num_beams=3)
    assert again.json()["generated_text"] == a.json()["generated_text"]


@pytest.mark.parametrize("model", MODELS)
async def test_every_architecture_answers_by_name(client, model):
    r = await generate(client, model=model, max_new_tokens=4, details=True)
    assert r.status_code == 200, r.text
    assert r.json()["details"]["generated_tokens"] == 4
    events = await stream_events(client, model=model, max_new_tokens=4, details=True)
    assert_stream(events, details=True)
    assert events[-1]["generated_text"] == r.json()["generated_text"]  # greedy: the same text either way


async def test_each_model_is_its_own(client):
    texts = {m: (await generate(client, model=m, max_new_tokens=6)).json()["generated_text"] for m in MODELS}
    default = (await generate(client, max_new_tokens=6)).json()["generated_text"]
    assert default == texts[MODELS[0]]
    assert len(set(texts.values())) == len(MODELS)


# ---- /generate_stream ------------------------------------------------------------------------


async def test_stream_sends_one_event_per_token_then_the_text(client):
    events = await stream_events(client, max_new_tokens=6)
    assert len(events) == 6
    assert_stream(events, details=False)
    plain = (await generate(client, max_new_tokens=6)).json()["generated_text"]
    assert events[-1]["generated_text"] == plain


async def test_stream_details_and_top_tokens(client):
    events = await stream_events(client, max_new_tokens=5, details=True, top_n_tokens=2, do_sample=True, seed=3)
    assert_stream(events, details=True)
    assert events[-1]["details"] == {"finish_reason": "length", "generated_tokens": 5, "seed": 3,
                                     "input_length": events[-1]["details"]["input_length"]}
    assert all(len(e["top_tokens"]) == 2 for e in events)


async def test_stream_stop_sequence_and_eos(client):
    events = await stream_events(client, model="tiny-gcnn", max_new_tokens=9, stop=["`t"], details=True)
    assert_stream(events, details=True)
    assert events[-1]["details"]["finish_reason"] == "stop_sequence" and events[-1]["generated_text"] == " a`t"
    async def send(seed):
        events = await stream_events(client, inputs="To be", model="tiny-lstm", max_new_tokens=60, do_sample=True,
                                     seed=seed, details=True)
        return events, events[-1]["details"]["finish_reason"]

    events = await sampled_until_eos(send)
    assert_stream(events, details=True)
    assert events[-1]["details"]["finish_reason"] == "eos_token" and events[-1]["token"]["special"]


async def test_stream_beam_search(client):
    events = await stream_events(client, max_new_tokens=5, num_beams=2, details=True)
    assert_stream(events, details=True)
    plain = (await generate(client, max_new_tokens=5, num_beams=2)).json()["generated_text"]
    assert events[-1]["generated_text"] == plain


async def test_stream_return_full_text(client):
    events = await stream_events(client, max_new_tokens=3, return_full_text=True)
    assert events[-1]["generated_text"] == "To be, or not" + visible_text([e["token"] for e in events])


# ---- / ---------------------------------------------------------------------------------------


async def test_compat_route_answers_a_list_or_a_stream(client):
    plain = (await generate(client, max_new_tokens=4, details=True)).json()
    r = await generate(client, route="/", max_new_tokens=4, details=True)
    assert r.status_code == 200 and r.json() == [plain]
    r = await generate(client, route="/", stream=False, max_new_tokens=4)
    assert r.json() == [{"generated_text": plain["generated_text"]}]
    events = await stream_events(client, route="/", stream=True, max_new_tokens=4, details=True)
    assert_stream(events, details=True)
    assert events[-1]["generated_text"] == plain["generated_text"]


# ---- errors ----------------------------------------------------------------------------------

LONG = "To be, or not to be, that is the question: " * 3

BAD_PARAMETERS = {
    "max_new_tokens zero": dict(max_new_tokens=0),
    "max_new_tokens negative": dict(max_new_tokens=-3),
    "max_new_tokens over the limit": dict(max_new_tokens=257),
    "max_new_tokens a string": dict(max_new_tokens="5"),
    "max_new_tokens a float": dict(max_new_tokens=5.0),
    "do_sample a string": dict(do_sample="yes"),
    "temperature zero": dict(temperature=0),
    "temperature negative": dict(temperature=-1.0),
    "top_p one": dict(top_p=1.0),
    "top_p zero": dict(top_p=0.0),
    "top_k zero": dict(top_k=0),
    "repetition_penalty zero": dict(repetition_penalty=0.0),
    "frequency_penalty out of range": dict(frequency_penalty=3.0),
    "stop a string": dict(stop="x"),
    "stop empty string": dict(stop=[""]),
    "too many stop sequences": dict(stop=[f"s{i}" for i in range(17)]),
    "seed negative": dict(seed=-1, do_sample=True),
    "seed over u64": dict(seed=2**64, do_sample=True),
    "typical_p": dict(typical_p=0.5),
    "watermark": dict(watermark=True),
    "grammar": dict(grammar={"type": "json", "value": {"type": "object", "unevaluatedProperties": False}}),
    "adapter_id": dict(adapter_id="lora"),
    "best_of without sampling": dict(best_of=2),
    "best_of with a seed": dict(best_of=2, do_sample=True, seed=1),
    "best_of over the limit": dict(best_of=17, do_sample=True),
    "top_n_tokens over the limit": dict(top_n_tokens=21),
    "truncate zero": dict(truncate=0),
    "num_beams over the limit": dict(num_beams=9),
    "num_beams with sampling": dict(num_beams=2, do_sample=True),
    "num_beams with stop": dict(num_beams=2, stop=["a"]),
    "length_penalty without beams": dict(length_penalty=0.5),
}


def assert_tgi_error(r, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type
    assert isinstance(body["error"], str) and body["error"]
    return body["error"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", list(BAD_PARAMETERS))
async def test_bad_parameters_are_400_before_any_byte(client, route, case):
    r = await generate(client, route=route, stream=True if route == "/" else None, **BAD_PARAMETERS[case])
    assert_tgi_error(r, 400, "validation")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("body", [
    b"{not json", b"[]", b'{"parameters": {}}', b'{"inputs": 5}', b'{"inputs": ""}', b'{"inputs": null}',
    b'{"inputs": "x", "parameters": []}', b'{"inputs": "x", "model": 3}', b'{"inputs": "x", "stream": "yes"}',
])
async def test_malformed_bodies_are_400(client, route, body):
    r = await client.post(route, content=body, headers={"content-type": "application/json"})
    message = assert_tgi_error(r, 400, "validation")
    if route != "/" and body.endswith(b'"stream": "yes"}'):  # only / reads stream; the others refuse it
        assert message == "Unrecognized request argument supplied: stream"


@pytest.mark.parametrize("route", ROUTES)
async def test_streaming_only_checks(client, route):
    stream = True if route == "/" else None
    streaming = route != "/generate"
    for parameters in (dict(decoder_input_details=True), dict(best_of=2, do_sample=True)):
        r = await generate(client, route=route, stream=stream, max_new_tokens=2, **parameters)
        if streaming:
            assert_tgi_error(r, 400, "validation")
        else:
            assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", ROUTES)
async def test_prompt_plus_max_new_tokens_beyond_the_context(client, app, route):
    num_prompt = len(app.state.host.get("tiny-transformer").tokenizer.encode(LONG))
    r = await generate(client, inputs=LONG, route=route, model="tiny-transformer", max_new_tokens=64)
    message = assert_tgi_error(r, 400, "validation")
    assert "64" in message and str(num_prompt) in message and str(num_prompt + 64) in message
    ok = await generate(client, inputs=LONG, route="/generate", model="tiny-transformer", truncate=8,
                        max_new_tokens=50)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("route", ROUTES)
async def test_unknown_model_is_404_listing_the_models(client, route):
    r = await generate(client, route=route, model="gpt-5", max_new_tokens=2)
    message = assert_tgi_error(r, 404, "not_found")
    assert all(m in message for m in MODELS)


@pytest.mark.parametrize("route", ROUTES)
async def test_loading_is_503(tiny_checkpoints, route):
    loading = create_app(None, server_config(tiny_checkpoints))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=loading), base_url="http://quill.test") as c:
        assert_tgi_error(await generate(c, route=route, max_new_tokens=2), 503, "unavailable")


@pytest.fixture
def default_engine(app):
    return app.state.host.get(None).engine


@pytest.mark.parametrize("route", ROUTES)
async def test_full_queue_is_429(client, default_engine, monkeypatch, route):
    def full(*args, **kwargs):
        raise QueueFullError("the queue is full (32 requests waiting)")

    monkeypatch.setattr(default_engine, "submit", full)
    r = await generate(client, route=route, max_new_tokens=2)
    assert_tgi_error(r, 429, "overloaded")
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize("route", ROUTES)
async def test_draining_is_503(client, app, route):
    app.state.draining = True
    try:
        r = await generate(client, route=route, max_new_tokens=2)
    finally:
        app.state.draining = False
    assert_tgi_error(r, 503, "unavailable")


class ScriptedStream:
    """Stands in for the engine's RequestStream: plays back outputs, then raises `fail` if given."""

    final = RequestStream.final  # the real merge, over these outputs

    def __init__(self, outputs, fail: Exception | None = None):
        self.outputs, self.fail, self.closed = outputs, fail, False
        self.finished = False

    def __aiter__(self):
        return self._play()

    async def _play(self):
        for out in self.outputs:
            yield out
        if self.fail is not None:
            raise self.fail

    def close(self):
        self.closed = True


def one_token_then(error: str | None):
    first = RequestOutput("r", [CompletionOutput(0, "a", [65], [TokenLogprob(65, -0.5)])], False, 3)
    if error is None:
        return [first]
    return [first, RequestOutput("r", [CompletionOutput(0, "", [], None, "error")], True, 3, error=error)]


@pytest.mark.parametrize("ending", ["error output", "engine died"])
async def test_engine_failure_mid_stream_ends_with_an_error_event(client, default_engine, monkeypatch, ending):
    scripted = (ScriptedStream(one_token_then("internal error while generating: boom")) if ending == "error output"
                else ScriptedStream(one_token_then(None), EngineDeadError("engine loop stopped")))
    monkeypatch.setattr(default_engine, "submit", lambda *a, **k: scripted)
    events = await stream_events(client, max_new_tokens=5)
    assert len(events) == 2
    assert events[0]["token"]["id"] == 65 and events[0]["generated_text"] is None
    assert set(events[1]) == {"error", "error_type"} and events[1]["error_type"] == "generation"
    assert scripted.closed


async def test_a_character_cut_short_by_eos_is_streamed_as_generated_text_shows_it(client, default_engine,
                                                                                   monkeypatch):
    """The last byte-level token starts a two-byte character and EOS follows: generated_text ends in U+FFFD, and
    the EOS event (special, so hidden by clients that show text) carries it before its own text."""
    first_byte_of_e_acute = 103  # "é" is bytes C3 A9, tokens 103 and 159 in the tiny byte-level vocabulary
    scripted = ScriptedStream([
        RequestOutput("r", [CompletionOutput(0, "", [65, first_byte_of_e_acute])], False, 3),
        RequestOutput("r", [CompletionOutput(0, "", [0], None, "stop")], True, 3),
    ])
    monkeypatch.setattr(default_engine, "submit", lambda *a, **k: scripted)
    events = await stream_events(client, max_new_tokens=5, details=True)
    assert_stream(events, details=True)
    assert [e["token"]["text"] for e in events] == ["a", "", "\ufffd<|endoftext|>"]
    assert events[-1]["generated_text"] == "a\ufffd" and events[-1]["details"]["finish_reason"] == "eos_token"


async def test_engine_failure_without_streaming_is_500(client, default_engine, monkeypatch):
    scripted = ScriptedStream(one_token_then("internal error while generating: boom"))
    monkeypatch.setattr(default_engine, "submit", lambda *a, **k: scripted)
    message = assert_tgi_error(await generate(client, max_new_tokens=5), 500, "generation")
    assert "boom" in message


async def test_info_describes_the_default_model_in_tgis_shape(client, tiny_checkpoints):
    r = await client.get("/info")
    assert r.status_code == 200
    info = r.json()
    assert info["model_id"] == tiny_checkpoints["tiny-transformer"] and info["model_sha"] is None  # a directory
    assert (info["model_dtype"], info["model_device_type"]) == ("torch.float32", TEST_DEVICE.type)
    assert (info["max_total_tokens"], info["max_input_tokens"], info["max_input_length"]) == (64, 63, 63)
    assert info["max_concurrent_requests"] == 16 + 32 and info["max_best_of"] == 16 and info["max_stop_sequences"] == 16
    assert info["router"] == "quill" and info["version"] == "0.1.0"
