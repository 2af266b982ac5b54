"""The OpenAI dialect in process: shapes, every decoding strategy on every architecture, every bad input."""

from __future__ import annotations

import json

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.api.bad_words import bad_words_token_ids
from quill.server.hosting import ModelHost
from tests.server.api.conftest import TINY, server_config

MODELS = list(TINY)


def sse_events(text: str) -> list:
    events = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def complete(client, **body):
    return await client.post("/v1/completions", json=body)


STRATEGIES = {
    "greedy": dict(temperature=0),
    "sampling": dict(temperature=1.0, seed=1),
    "temperature": dict(temperature=0.7, seed=2),
    "top_k": dict(top_k=5, seed=3),
    "top_p": dict(top_p=0.8, seed=4),
    "min_p": dict(min_p=0.1, seed=5),
    "penalties": dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, seed=6),
    "logit_bias": dict(logit_bias={"7": 5.0}, seed=7),
    "beam": dict(use_beam_search=True, best_of=3, n=2, temperature=0),
    "n": dict(n=3, seed=8),
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_every_strategy_on_every_architecture(client, model, strategy):
    body = dict(model=model, prompt="To be, or not", max_tokens=6, ignore_eos=True, **STRATEGIES[strategy])
    r = await complete(client, **body)
    assert r.status_code == 200, r.text
    data = r.json()
    n = body.get("n", 1)
    assert [c["index"] for c in data["choices"]] == list(range(n))
    assert all(c["finish_reason"] == "length" for c in data["choices"])
    assert data["usage"]["completion_tokens"] == 6 * n
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 6 * n
    assert data["model"] == model and data["object"] == "text_completion"


async def test_greedy_is_deterministic_and_seed_reproduces(client):
    a = (await complete(client, prompt="the mind", max_tokens=8, temperature=0)).json()
    b = (await complete(client, prompt="the mind", max_tokens=8, temperature=0)).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    c = (await complete(client, prompt="the mind", max_tokens=8, seed=42, ignore_eos=True)).json()
    d = (await complete(client, prompt="the mind", max_tokens=8, seed=42, ignore_eos=True)).json()
    assert c["choices"][0]["text"] == d["choices"][0]["text"]


async def test_list_of_prompts_and_token_prompts(client):
    r = await complete(client, prompt=["To be", "or not"], max_tokens=3, n=2, ignore_eos=True)
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    r = await complete(client, prompt=[5, 6, 7], max_tokens=3, ignore_eos=True)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3
    r = await complete(client, prompt=[[5, 6], [7, 8, 9]], max_tokens=2, ignore_eos=True)
    assert r.json()["usage"]["prompt_tokens"] == 5


async def test_echo_with_logprobs_scores_the_prompt(client):
    r = await complete(client, prompt="To be, or not", max_tokens=2, echo=True, logprobs=2, temperature=0, ignore_eos=True)
    choice = r.json()["choices"][0]
    assert choice["text"].startswith("To be, or not")
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert len(lp["tokens"]) == len(lp["text_offset"]) == len(lp["top_logprobs"])
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(len(t) == 2 for t in lp["top_logprobs"][1:])


async def test_streaming_chunks_add_up_and_end_with_done(client):
    r = await complete(client, prompt="To be", max_tokens=6, stream=True, temperature=0, ignore_eos=True,
                       stream_options={"include_usage": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    chunks = events[:-2]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    full = (await complete(client, prompt="To be", max_tokens=6, temperature=0, ignore_eos=True)).json()
    assert streamed == full["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == 6


async def test_stop_string_is_not_returned(client):
    full = (await complete(client, prompt="To be", max_tokens=12, temperature=0, ignore_eos=True)).json()["choices"][0]["text"]
    assert len(full) >= 4, f"12 greedy tokens should give text to cut a stop string from, got {full!r}"
    stop = full[2:4]
    r = (await complete(client, prompt="To be", max_tokens=12, temperature=0, ignore_eos=True, stop=stop)).json()
    assert r["choices"][0]["text"] == full[: full.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("model", MODELS)
async def test_bad_words_are_never_generated(client, app, model):
    """vLLM's bad_words: each token of the greedy answer whose text the tokenizer spells as that one token (alone
    or after a space) is banned; the answer changes, and none of those tokens is in it (TGI's details give ids)."""
    tokenizer = app.state.host.get(model).loaded.tokenizer
    prompt = "To be, or not"

    async def greedy_tokens(**extra) -> list[dict]:
        body = dict(model=model, prompt=prompt, max_tokens=8, temperature=0, ignore_eos=True, logprobs=0, **extra)
        return (await complete(client, **body)).json()["choices"][0]

    r = await client.post("/generate", json={"inputs": prompt, "model": model, "parameters": {
        "max_new_tokens": 8, "details": True}})
    tokens = r.json()["details"]["tokens"]
    words = [t["text"] for t in tokens if t["text"].strip() and [t["id"]] in bad_words_token_ids(tokenizer, [t["text"]])]
    assert words, f"{model}: no greedy token spells itself, so nothing here would be banned"
    free, banned = await greedy_tokens(), await greedy_tokens(bad_words=words)
    assert free["text"] == "".join(t["text"] for t in tokens) != banned["text"]
    ids = {t["id"] for t in tokens if t["text"] in words}
    assert not ids & {tokenizer.token_to_id(t) for t in banned["logprobs"]["tokens"]}


async def test_models_health_ready(client):
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == MODELS
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    assert (await client.get("/openapi.json")).json()["paths"]["/v1/completions"]
    assert (await client.get("/docs")).status_code == 200


BAD_REQUESTS = [
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": 0}, "top_k"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 100}, "best_of"),
    ({"prompt": "x", "use_beam_search": True, "best_of": 50}, "best_of"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ({"prompt": "", "max_tokens": 2}, "prompt"),
    ({"prompt": [], "max_tokens": 2}, "prompt"),
    ({"prompt": "x", "stop": ["s"] * 100}, "stop"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": 3}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "x", "presence_penalty": float("nan")}, None),
    ({"prompt": "x", "bad_words": ["s"] * 100}, "bad_words"),
    ({"prompt": "x", "bad_words": [""]}, "bad_words"),
    ({"prompt": "x", "bad_words": ["   "]}, "bad_words"),
    ({"prompt": "x", "bad_words": "word"}, "bad_words"),
    ({"prompt": "x", "coverage_penalty": 0.5}, "coverage_penalty"),  # needs beam search
    ({"prompt": "x", "use_beam_search": True, "best_of": 2, "coverage_penalty": 0.5}, "coverage_penalty"),  # attention
    ({"prompt": "x", "use_beam_search": True, "best_of": 2, "coverage_penalty_type": "gnmt"}, "coverage_penalty_type"),
]


@pytest.mark.parametrize("body,param", BAD_REQUESTS, ids=lambda v: str(v)[:40])
async def test_bad_input_gets_400_in_openai_shape(client, body, param):
    r = await client.post("/v1/completions", content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] and error["param"].split(".")[0] == param


async def test_context_overflow_names_both_numbers(client):
    r = await complete(client, model="tiny-transformer", prompt="the mind " * 10, max_tokens=200)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "64" in message and "200" in message and r.json()["error"]["code"] == "context_length_exceeded"


async def test_malformed_json_unknown_model_and_wrong_method(client):
    r = await client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = await complete(client, model="gpt-9", prompt="x")
    assert r.status_code == 404 and all(m in r.json()["error"]["message"] for m in MODELS)
    assert (await client.get("/v1/completions")).status_code == 405


async def test_oversized_body_gets_413(client, app):
    big = {"prompt": "x" * (app.state.config.max_body_bytes + 10)}
    r = await client.post("/v1/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


async def test_api_key_is_required_when_set(tiny_checkpoints):
    config = server_config(tiny_checkpoints, api_keys=["k1", "k2"])
    host = ModelHost.load(config)
    host.start()
    app = create_app(host, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            body = {"prompt": "x", "max_tokens": 1}
            assert (await c.post("/v1/completions", json=body)).status_code == 401
            bad = await c.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
            assert (await c.get("/v1/models")).status_code == 401
            for key in ("k1", "k2"):
                ok = await c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                assert ok.status_code == 200
            for open_path in ("/health", "/ready", "/metrics"):
                assert (await c.get(open_path)).status_code == 200
    finally:
        host.shutdown()


async def test_loading_server_is_not_ready(tiny_checkpoints):
    app = create_app(None, server_config(tiny_checkpoints))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/ready")).status_code == 503
        assert (await c.get("/health")).status_code == 200
        r = await complete(c, prompt="x", max_tokens=1)
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]


async def test_beam_search_with_stop_strings_is_refused(client):
    r = await complete(client, prompt="x", use_beam_search=True, best_of=2, stop=["a"])
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


async def test_draining_server_refuses_new_work(client, app):
    app.state.draining = True
    try:
        assert (await client.get("/ready")).status_code == 503
        r = await complete(client, prompt="x", max_tokens=1)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        app.state.draining = False


async def test_queue_full_gets_429_with_retry_after(tiny_checkpoints):
    import asyncio
    import threading

    # on a thread (a GPU's default is a process), so that the test can hold its steps
    config = server_config(tiny_checkpoints, max_queue=1, models=[f"m={tiny_checkpoints['tiny-lstm']}"],
                           engine_process=False)
    host = ModelHost.load(config)
    engine = host.get("m").engine
    paused = threading.Event()
    real_step = engine.core.step

    def held_step():  # the engine stalls until released: the queue fills deterministically
        paused.wait(timeout=30)
        return real_step()

    engine.core.step = held_step
    host.start()
    app = create_app(host, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            first = asyncio.create_task(complete(c, prompt="x", max_tokens=3, ignore_eos=True))
            for _ in range(500):
                if engine.num_pending >= 1:
                    break
                await asyncio.sleep(0.01)
            r = await complete(c, prompt="x", max_tokens=1)
            assert r.status_code == 429 and r.headers["Retry-After"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            paused.set()
            assert (await first).status_code == 200  # the admitted request is unaffected
    finally:
        paused.set()
        host.shutdown()


async def test_metrics_count_requests_per_model(client):
    await complete(client, model="tiny-gcnn", prompt="x", max_tokens=3, ignore_eos=True)
    text = (await client.get("/metrics")).text
    for name in ("quill_requests_total", "quill_request_errors_total", "quill_prompt_tokens_total",
                 "quill_generation_tokens_total", "quill_time_to_first_token_seconds_bucket",
                 "quill_inter_token_latency_seconds_bucket", "quill_e2e_request_latency_seconds_bucket",
                 "quill_request_queue_time_seconds_bucket", "quill_batch_size_bucket", "quill_num_requests_running",
                 "quill_num_requests_waiting", "quill_cache_usage_ratio", "quill_prefix_cache_queries_total",
                 "quill_prefix_cache_hits_total", "quill_num_preemptions_total"):
        assert name in text, name
    assert 'quill_requests_total{finish_reason="length",model="tiny-gcnn"}' in text
