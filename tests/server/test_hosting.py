"""`quill serve` hosts checkpoints by hub id from an offline Hugging Face cache, and stops
on the EOS ids of their generation_config.json."""

from __future__ import annotations

import httpx
import pytest
import torch
import transformers

from server.config import ServerConfig, add_serve_arguments, config_from_args
from tests.conftest import TEST_DEVICE, LiveServer
from tests.hub_checkpoints import CHAT_MIN_TOKENS, CHAT_PROMPT

LLAMA, MISTRAL = "quill-test/tiny-llama-chat", "quill-test/tiny-mistral"


@pytest.fixture(scope="module")
def hub_server(hub_cache):
    cache, _ = hub_cache
    server = LiveServer({}, "--model", LLAMA, "--model", f"mistral={MISTRAL}",
                        env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_models_are_served_by_hub_id(hub_server):
    listed = httpx.get(f"{hub_server.url}/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [LLAMA, "mistral"]


def test_greedy_completion_stops_on_a_generation_config_eos_id(hub_server, hub_cache):
    checkpoint = hub_cache[1][LLAMA]
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint.path)
    eos = transformers.GenerationConfig.from_pretrained(checkpoint.path).eos_token_id
    prompt_ids = tokenizer(CHAT_PROMPT).input_ids
    expected = checkpoint.reference.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=12,
                                             eos_token_id=eos, pad_token_id=0)[0, len(prompt_ids):].tolist()
    assert CHAT_MIN_TOKENS <= len(expected) < 12 and expected[-1] in eos and expected[-1] not in expected[:-1]
    # config.json's EOS is not it: only generation_config.json's longer list stops there.
    assert expected[-1] != transformers.AutoConfig.from_pretrained(checkpoint.path).eos_token_id
    body = httpx.post(f"{hub_server.url}/v1/completions", timeout=30, json={
        "model": LLAMA, "prompt": CHAT_PROMPT, "max_tokens": 12, "temperature": 0}).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)  # BOS included, as the tokenizer declares
    assert body["usage"]["completion_tokens"] == len(expected)
    assert body["choices"][0]["text"] == tokenizer.decode(expected[:-1], skip_special_tokens=True)


def test_sliding_window_bounds_the_served_context(hub_server):
    too_long = httpx.post(f"{hub_server.url}/v1/completions", timeout=30, json={
        "model": "mistral", "prompt": "To be, or not to be " * 8, "max_tokens": 40})
    assert too_long.status_code == 400 and "48" in too_long.text


def test_load_log_names_the_generation_defaults(hub_server):
    logged = "sampling defaults from generation_config.json: temperature=0.6, top_p=0.9, max_tokens=64"
    assert logged in hub_server.output()


def test_load_log_says_how_many_tokens_the_cache_holds(hub_server, offline_hub):
    from models.checkpoint import load_checkpoint

    config = load_checkpoint(LLAMA, device="cpu").model.config
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4  # K and V in float32
    backend = "triton" if TEST_DEVICE.type == "cuda" else "sdpa"
    # LiveServer reserves 4 MiB per model.
    assert f"({4 * 2**20 // per_token} tokens of K,V in blocks of 4, attention {backend})" in hub_server.output()


def parse(*argv: str) -> ServerConfig:
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_generation_config_flag(monkeypatch):
    assert parse().generation_config == "auto"
    assert parse("--generation-config", "none").generation_config == "none"
    monkeypatch.setenv("QUILL_GENERATION_CONFIG", "none")
    assert parse().generation_config == "none"
    with pytest.raises(SystemExit):
        parse("--generation-config", "vllm")
    with pytest.raises(ValueError, match="generation_config must be one of"):
        ServerConfig(generation_config="sometimes")


def test_attention_backend_flag(monkeypatch):
    assert parse().attention_backend == "auto"
    assert parse("--attention-backend", "sdpa").attention_backend == "sdpa"
    monkeypatch.setenv("QUILL_ATTENTION_BACKEND", "triton")
    assert parse().attention_backend == "triton"
    with pytest.raises(SystemExit):
        parse("--attention-backend", "flash")


def test_cache_size_flags(monkeypatch):
    assert (parse().cache_bytes, parse().gpu_memory_utilization) == (None, 0.9)  # sized from the GPU, or 256 MiB
    assert parse("--cache-bytes", "1024", "--gpu-memory-utilization", "0.5").cache_bytes == 1024
    monkeypatch.setenv("QUILL_GPU_MEMORY_UTILIZATION", "0.75")
    assert parse().gpu_memory_utilization == 0.75
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        ServerConfig(gpu_memory_utilization=1.2)


def test_bare_hub_id_is_named_by_itself(tmp_path):
    config = ServerConfig(models=[LLAMA, str(tmp_path), "short=org/model"])
    assert config.model_specs() == [(LLAMA, LLAMA), (tmp_path.name, str(tmp_path)), ("short", "org/model")]
