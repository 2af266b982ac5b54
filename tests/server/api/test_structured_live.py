"""Structured outputs on the real server, its engine in a process of its own, through the official openai client:
a bundled model and a tiny random hub checkpoint answer JSON that validates, every seed, at temperature 1."""

from __future__ import annotations

import json
import re
import threading
import time

import jsonschema
import openai
import pytest

from quill.models.loading.checkpoint import BUNDLED_DIR
from tests.server.api.conftest import LiveServer

QWEN = "quill-test/tiny-qwen2"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["king", "queen", "ghost"]},
        "lines": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "age", "role", "lines"],
    "additionalProperties": False,
}
# About two seconds to compile on a 2-core machine, well past the server's limit below on a faster one too.
SLOW_SCHEMA = {"type": "object", "properties": {
    f"p{i}": {"type": "object", "properties": {f"q{j}": {"type": "string", "pattern": "[a-z]{3,30}"} for j in range(60)}}
    for i in range(240)}}


@pytest.fixture(scope="module")
def server(hub_cache):
    models = {"shakespeare": str(BUNDLED_DIR / "shakespeare-transformer"), "qwen": str(hub_cache[1][QWEN].path)}
    with LiveServer(models, "--engine-process", "--grammar-timeout", "0.3") as live:
        yield live


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", ["shakespeare", "qwen"])
def test_json_schema_answers_validate_for_every_seed(client, model):
    response_format = {"type": "json_schema", "json_schema": {"name": "character", "schema": SCHEMA, "strict": True}}
    for seed in range(4):
        done = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Who speaks?"}],
                                              temperature=1.0, seed=seed, max_tokens=100,
                                              response_format=response_format)
        choice = done.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_regex_and_choice_with_n_samples(client):
    done = client.completions.create(model="shakespeare", prompt="Act", max_tokens=20, n=3, temperature=1.0,
                                     extra_body={"structured_outputs": {"regex": r"[IVX]{1,4}\. Scene [0-9]"}})
    assert len(done.choices) == 3
    for choice in done.choices:
        assert re.fullmatch(r"[IVX]{1,4}\. Scene [0-9]", choice.text), choice
    done = client.completions.create(model="qwen", prompt="Who?", max_tokens=20, n=2, temperature=1.0,
                                     extra_body={"guided_choice": ["Hamlet", "Horatio", "the Ghost"]})
    assert {c.text for c in done.choices} <= {"Hamlet", "Horatio", "the Ghost"}


def test_grammar_with_beam_search(client):
    grammar = 'start: who " " verb\nwho: "Hamlet" | "Ophelia" | "the king"\nverb: "speaks" | "dies" | "sleeps"'
    done = client.completions.create(model="shakespeare", prompt="Then", max_tokens=20, n=2, best_of=3,
                                     extra_body={"use_beam_search": True, "guided_grammar": grammar})
    assert len(done.choices) == 2
    for choice in done.choices:
        assert re.fullmatch(r"(Hamlet|Ophelia|the king) (speaks|dies|sleeps)", choice.text), choice


def test_an_unsupported_keyword_is_a_400_naming_it(client):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "unevaluatedProperties": False}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="shakespeare", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert "unevaluatedProperties" in str(info.value)


def test_a_slow_schema_is_refused_in_bounded_time_while_others_stream(client):
    received: list[float] = []
    streaming, refused_now = threading.Event(), threading.Event()

    def stream_meanwhile():  # stream after stream until the refusal, so one runs through the compile however fast
        while not refused_now.is_set():
            stream = client.completions.create(model="shakespeare", prompt="To be", max_tokens=250, temperature=1.0,
                                               stream=True, extra_body={"ignore_eos": True})
            with stream:
                for _ in stream:
                    received.append(time.monotonic())
                    streaming.set()
                    if refused_now.is_set():
                        break

    streamer = threading.Thread(target=stream_meanwhile)
    streamer.start()
    try:
        assert streaming.wait(timeout=30)
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="shakespeare", prompt="x", max_tokens=5,
                                      extra_body={"guided_json": SLOW_SCHEMA})
        refused = time.monotonic()
    finally:
        refused_now.set()
        streamer.join(timeout=120)
    assert refused - start < 5 and "longer than 0.3 s" in str(info.value)
    assert not streamer.is_alive()
    # The stream went on while the schema compiled: chunks arrived while the refused request waited.
    assert sum(start <= t <= refused for t in received) >= 2, (refused - start, received[0], received[-1])
