"""Constraints in every dialect's fields, through the in-process app: the answer follows them, refusals say why."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost
from tests.server.api.test_tgi import generate

SCHEMA = {"type": "object", "properties": {"word": {"enum": ["to", "be"]}, "n": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 99}},
          "required": ["word", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def app(hub_cache):
    """shakespeare (the default): a bundled byte-level BPE model with a chat template; mistral: a hub checkpoint
    with a SentencePiece-like tokenizer ("▁" pieces; its few pieces spell no "{", so it gets regexes only)."""
    config = ServerConfig(models=["shakespeare=shakespeare-transformer",
                                  f"mistral={hub_cache[1]['quill-test/tiny-mistral'].path}"],
                          device="cpu", dtype="float32", cache_bytes=4 * 2**20, block_size=4, max_tokens_limit=256)
    host = ModelHost.load(config)
    host.start()
    yield create_app(host, config)
    host.shutdown()


async def chat(client, **body) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"model": "shakespeare", **body})


def follows(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"word", "n"} and value["word"] in ("to", "be") and 0 <= value["n"] <= 99


async def test_chat_response_format_json_schema(client):
    r = await chat(client, messages=[{"role": "user", "content": "hi"}], max_tokens=60, temperature=1.0, seed=1,
                   response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA,
                                                                           "strict": True}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert follows(choice["message"]["content"]) and choice["finish_reason"] == "stop"


@pytest.mark.parametrize("fields, pattern", [
    (dict(structured_outputs={"regex": "[a-c]{3}-[0-9]{2}"}), r"[a-c]{3}-[0-9]{2}"),
    (dict(guided_regex="[a-c]{3}-[0-9]{2}"), r"[a-c]{3}-[0-9]{2}"),
    (dict(structured_outputs={"choice": ["Hamlet", "Ophelia"]}), r"Hamlet|Ophelia"),
    (dict(guided_choice=["Hamlet", "Ophelia"]), r"Hamlet|Ophelia"),
    (dict(guided_grammar='start: "ab" | "cd"'), r"ab|cd"),
])
async def test_completions_vllm_fields(client, fields, pattern):
    r = await client.post("/v1/completions", json={"model": "shakespeare", "prompt": "To be", "max_tokens": 30,
                                                   "temperature": 1.0, "n": 2, **fields})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert re.fullmatch(pattern, choice["text"]), choice


async def test_completions_json_object_and_guided_json(client):
    for fields in (dict(response_format={"type": "json_object"}), dict(guided_json=SCHEMA),
                   dict(structured_outputs={"json": json.dumps(SCHEMA)})):
        r = await client.post("/v1/completions", json={"model": "shakespeare", "prompt": "To be", "max_tokens": 80,
                                                       "temperature": 0.8, "seed": 2, **fields})
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        if r.json()["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)


async def test_a_metaspace_tokenizer_follows_a_regex(client):
    r = await client.post("/v1/completions", json={"model": "mistral", "prompt": "To be", "max_tokens": 20, "n": 3,
                                                   "temperature": 1.0, "guided_regex": "(the|no) (be,|to)"})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert re.fullmatch("(the|no) (be,|to)", choice["text"]), choice


async def test_tgi_grammar_and_messages_response_format(client):
    r = await generate(client, max_new_tokens=30, do_sample=True, seed=4,
                       grammar={"type": "regex", "value": "(yes|no), [0-9]"})
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"(yes|no), [0-9]", r.json()["generated_text"])
    r = await generate(client, max_new_tokens=60, grammar={"type": "json", "value": SCHEMA})
    assert follows(r.json()["generated_text"])
    r = await chat(client, messages=[{"role": "user", "content": "hi"}], max_tokens=60,
                   response_format={"type": "json_object", "value": SCHEMA})
    assert follows(r.json()["choices"][0]["message"]["content"])
    r = await chat(client, messages=[{"role": "user", "content": "hi"}], max_tokens=60,
                   response_format={"type": "json_schema", "value": {"name": "w", "schema": SCHEMA}})
    assert follows(r.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize("fields, param, words", [
    (dict(guided_json={"type": "object", "patternProperties": {"a": {}}, "dependentSchemas": {}}), "guided_json",
     "dependentSchemas"),
    (dict(guided_regex="a(b"), "guided_regex", "regex"),
    (dict(guided_regex="a", guided_choice=["b"]), "guided_choice", "only one constraint"),
    (dict(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs", "one constraint"),
    (dict(structured_outputs={"whitespace_pattern": " "}), "structured_outputs.whitespace_pattern", "Unrecognized"),
    (dict(response_format={"type": "json_schema"}), "response_format", "json_schema.schema"),
])
async def test_refusals_name_what_was_refused(client, fields, param, words):
    r = await client.post("/v1/completions", json={"model": "shakespeare", "prompt": "To be", "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


async def test_allowed_next_tokens_for_the_playground(client):
    body = {"model": "shakespeare", "structured_outputs": {"json": SCHEMA}, "text": '{"word":"',
            "alternatives": ["to", "be", "xyz", "}"]}
    r = await client.post("/v1/structured/allowed", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["text_follows"] and answer["allowed"] == [True, True, False, False]
    assert 0 < answer["num_allowed"] < answer["vocab_size"]
    r = await client.post("/v1/structured/allowed", json={**body, "text": "nope"})
    assert r.json()["text_follows"] is False
