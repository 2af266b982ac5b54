"""vLLM's /tokenize and /detokenize in process, over the tiny checkpoints (no chat template) and the
bundled Shakespeare transformer (with one): vLLM's shapes, chat messages tokenized as the chat
route would, OpenAI-shaped errors."""

from __future__ import annotations

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost


@pytest.fixture(scope="module")
def app(tiny_checkpoints):
    config = ServerConfig(models=[f"tiny={tiny_checkpoints['tiny-transformer']}", "shakespeare=shakespeare-lstm"],
                          device="cpu", dtype="float32", cache_bytes=2**20, block_size=4)
    host = ModelHost.load(config)  # never started: these routes only tokenize
    yield create_app(host, config)


@pytest.fixture
async def client(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as c:
        yield c


async def test_tokenize_a_prompt(client, app):
    tokenizer = app.state.host.models["tiny"].tokenizer
    r = await client.post("/tokenize", json={"model": "tiny", "prompt": "To be, or not"})
    ids = tokenizer.encode("To be, or not")
    assert r.status_code == 200
    assert r.json() == {"count": len(ids), "max_model_len": 64, "tokens": ids, "token_strs": None}
    strs = (await client.post("/tokenize", json={"prompt": "To be", "return_token_strs": True})).json()
    assert strs["token_strs"] == [tokenizer.id_to_token(i) for i in strs["tokens"]] and strs["max_model_len"] == 64


async def test_tokenize_chat_messages_as_the_chat_route_would(client, app):
    hosted = app.state.host.models["shakespeare"]
    messages = [{"role": "user", "content": "Who is there?"}]
    r = await client.post("/tokenize", json={"model": "shakespeare", "messages": messages})
    assert r.json()["tokens"] == hosted.tokenizer.encode("USER.\nWho is there?\n\nQUILL.\n", add_special_tokens=False)
    assert r.json()["max_model_len"] == hosted.max_model_len == 4096
    bare = await client.post("/tokenize", json={"model": "shakespeare", "messages": messages,
                                                "add_generation_prompt": False})
    assert bare.json()["tokens"] == hosted.tokenizer.encode("USER.\nWho is there?\n\n", add_special_tokens=False)
    missing = await client.post("/tokenize", json={"model": "tiny", "messages": messages})
    assert missing.status_code == 400 and "has no chat template" in missing.json()["error"]["message"]


async def test_detokenize_inverts_tokenize(client):
    ids = (await client.post("/tokenize", json={"prompt": "To be, or not to be"})).json()["tokens"]
    r = await client.post("/detokenize", json={"model": "tiny", "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "To be, or not to be"}
    special = await client.post("/detokenize", json={"tokens": [0]})
    assert special.json() == {"prompt": "<|endoftext|>"}  # special tokens shown, as vLLM does


@pytest.mark.parametrize("route, body, status, param", [
    ("/detokenize", {"tokens": [10**6]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/tokenize", b'{"prompt": "\\ud800"}', 400, "prompt"),  # JSON can carry a lone surrogate; text cannot
    ("/tokenize", {"model": "shakespeare", "messages": []}, 400, "messages"),
])
async def test_errors_are_openai_shaped(client, route, body, status, param):
    if isinstance(body, bytes):
        r = await client.post(route, content=body, headers={"content-type": "application/json"})
    else:
        r = await client.post(route, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"].startswith(param)
