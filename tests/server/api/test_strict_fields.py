"""A field no route knows is refused, never dropped: `"max_tokns": 5` would otherwise run with the default.
Every dialect answers 400 naming the field (OpenAI's words, each dialect's shape), at every level of the
body, before any byte, streamed or not. Chat messages: test_chat.py; real clients: test_*_client*.py."""

from __future__ import annotations

import pytest

OPENAI = "Unrecognized request argument supplied: "
PROMPT = "To be, or not"
MESSAGES = [{"role": "user", "content": "hi"}]

MISSPELLED = [  # (route, body, the field as the error names it)
    ("/v1/completions", {"prompt": PROMPT, "max_tokns": 5}, "max_tokns"),
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "stream_options": {"include_usag": True}},
     "stream_options.include_usag"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokns": 5}, "max_tokns"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "nmae": "Horatio"}]},
     "messages.0.nmae"),
    ("/v1/chat/completions", {"messages": MESSAGES, "stream": True, "stream_options": {"include_usag": True}},
     "stream_options.include_usag"),
    ("/tokenize", {"prompt": PROMPT, "add_special_token": False}, "add_special_token"),
    ("/tokenize", {"messages": MESSAGES, "add_generation_promt": False}, "add_generation_promt"),
    ("/detokenize", {"tokens": [1], "skip_special_tokens": True}, "skip_special_tokens"),
    ("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokns": 5}}, "parameters.max_new_tokns"),
    ("/generate", {"inputs": PROMPT, "paramters": {"max_new_tokens": 5}}, "paramters"),
    ("/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokns": 5}}, "parameters.max_new_tokns"),
    ("/generate_stream", {"inputs": PROMPT, "stream": True}, "stream"),  # only / reads stream
    ("/", {"inputs": PROMPT, "stream": True, "parameters": {"temprature": 0.5}}, "parameters.temprature"),
    ("/", {"inputs": PROMPT, "strem": True}, "strem"),
]


@pytest.mark.parametrize("route, body, field", MISSPELLED, ids=[f"{r} {f}" for r, _, f in MISSPELLED])
async def test_a_misspelled_field_is_a_400_naming_it(client, route, body, field):
    r = await client.post(route, json=body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    if route.startswith("/v1/") or route in ("/tokenize", "/detokenize"):
        assert r.json() == {"error": {"message": OPENAI + field, "type": "invalid_request_error", "param": field,
                                      "code": None}}
    else:
        assert r.json() == {"error": OPENAI + field, "error_type": "validation"}


async def test_every_unknown_field_is_named_and_wins_over_what_it_explains(client):
    # "promt" explains the missing "prompt": the unknown fields are named, not the missing one.
    r = await client.post("/v1/completions", json={"promt": PROMPT, "max_tokns": 5})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == "Unrecognized request arguments supplied: promt, max_tokns"
    assert error["param"] == "promt"


async def test_an_empty_field_name_is_named_too(client):
    r = await client.post("/detokenize", json={"tokens": [1], "": None})
    assert r.status_code == 400 and r.json()["error"]["message"] == OPENAI + '""'


async def test_a_tokenize_body_is_read_as_the_kind_it_names(client):
    """A prompt body's error names its own fields, not the chat body's it also resembles."""
    r = await client.post("/tokenize", json={"prompt": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = await client.post("/tokenize", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


async def test_the_fields_a_dialect_knows_stay_accepted(client):
    completion = await client.post("/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 2, "user": "u-1", "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": False}})
    assert completion.status_code == 200, completion.text
    tgi = await client.post("/generate", json={"inputs": PROMPT, "model": "tiny-transformer", "parameters": {
        "max_new_tokens": 2, "typical_p": None, "watermark": False, "grammar": None, "adapter_id": None,
        "decoder_input_details": False, "details": False, "return_full_text": False, "top_n_tokens": None,
        "truncate": None, "best_of": None, "seed": None, "stop": [], "do_sample": False}})
    assert tgi.status_code == 200, tgi.text
