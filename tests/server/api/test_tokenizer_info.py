"""vLLM's GET /tokenizer_info in process: a checkpoint's tokenizer_config.json as vLLM answers it (file names
dropped, AddedToken objects as their strings), with what the server uses laid over it; a checkpoint without the
file still names its EOS; ?model picks a model; errors are OpenAI-shaped."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost

TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def configured_checkpoint(tiny_checkpoints, tmp_path_factory):
    """The tiny Transformer with a tokenizer_config.json as transformers saves one."""
    path = tmp_path_factory.mktemp("configured") / "tiny"
    shutil.copytree(tiny_checkpoints["tiny-transformer"], path)
    added = {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False, "rstrip": False, "special": True}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "vocab_file": "vocab.json", "merges_file": "merges.txt",
        "eos_token": added, "bos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {"0": {k: v for k, v in added.items() if k != "__type"}},
        "chat_template": TEMPLATE,
    }))
    return str(path)


@pytest.fixture(scope="module")
def app(tiny_checkpoints, configured_checkpoint):
    config = ServerConfig(models=[f"tiny={tiny_checkpoints['tiny-transformer']}", f"configured={configured_checkpoint}",
                                  "shakespeare=shakespeare-lstm"],
                          device="cpu", dtype="float32", cache_bytes=2**20, block_size=4)
    host = ModelHost.load(config)  # never started: the route only reads the tokenizer's settings
    yield create_app(host, config)


@pytest.fixture
async def client(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as c:
        yield c


async def test_a_checkpoint_without_tokenizer_config_names_its_eos(client, app):
    r = await client.get("/tokenizer_info")  # the default model
    assert r.status_code == 200
    tiny = app.state.host.models["tiny"]
    assert r.json() == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                        "add_bos_token": False, "model_max_length": tiny.max_model_len}
    assert tiny.tokenizer.token_to_id("<|endoftext|>") == tiny.loaded.eos_token_ids[0]


async def test_tokenizer_config_as_vllm_answers_it(client, app):
    info = (await client.get("/tokenizer_info", params={"model": "configured"})).json()
    assert info["tokenizer_class"] == "GPT2Tokenizer"
    assert "vocab_file" not in info and "merges_file" not in info
    assert info["eos_token"] == info["bos_token"] == "<|endoftext|>"
    assert info["added_tokens_decoder"] == {"0": "<|endoftext|>"}
    assert info["clean_up_tokenization_spaces"] is False
    assert info["chat_template"] == TEMPLATE == app.state.host.models["configured"].chat_template.source
    assert info["model_max_length"] == app.state.host.models["configured"].max_model_len


async def test_the_template_chats_render_with(client, app):
    info = (await client.get("/tokenizer_info", params={"model": "shakespeare"})).json()
    assert info["chat_template"] == app.state.host.models["shakespeare"].chat_template.source


async def test_an_unknown_model_is_an_openai_error(client):
    r = await client.get("/tokenizer_info", params={"model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
