"""Our checkpoint format round-trips; every bad checkpoint gives one clear error."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from quill.models.loading.checkpoint import CheckpointError, keep_float32_exact, load_checkpoint, save_checkpoint
from quill.models.text.tokenizer import Tokenizer
from tests.conftest import TEST_DEVICE, TINY_CONFIGS, build_hf_tokenizer, build_tiny_model

V = 300


def write_checkpoint(directory, key="transformer-llama", dtype=torch.float32):
    arch, model = build_tiny_model(key, V)
    save_checkpoint(directory, arch, model, Tokenizer(build_hf_tokenizer(V), eos_token_id=0), dtype=dtype)
    return model


@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_round_trip_gives_the_same_logits(tmp_path, key):
    model = write_checkpoint(tmp_path, key)
    loaded = load_checkpoint(tmp_path, device=TEST_DEVICE, dtype="float32")
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]], device=TEST_DEVICE)
    torch.testing.assert_close(loaded.model(tokens), model(tokens), atol=0, rtol=0)
    assert loaded.tokenizer.eos_token_id == 0 and loaded.eos_token_ids == [0]
    assert not any(p.requires_grad for p in loaded.model.parameters())


def test_sixteen_bit_checkpoint_loads_in_any_dtype(tmp_path):
    write_checkpoint(tmp_path, dtype=torch.float16)
    assert all(t.dtype == torch.float16 for t in load_file(tmp_path / "model.safetensors").values())
    for dtype in ("float32", "bfloat16", "float16"):
        loaded = load_checkpoint(tmp_path, device="cpu", dtype=dtype)
        assert loaded.model.embed.weight.dtype == (loaded.dtype if loaded.weights_dtype else getattr(torch, dtype))
        assert loaded.model.layers[0].attn.qkv.weight.dtype == getattr(torch, dtype)


def expect_error(path, *fragments):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, device="cpu")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_directory(tmp_path):
    expect_error(tmp_path / "nope", "nope", "no such checkpoint directory")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_missing_file(tmp_path, name):
    write_checkpoint(tmp_path)
    (tmp_path / name).unlink()
    expect_error(tmp_path, name, "missing file")


def test_unknown_architecture(tmp_path):
    write_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architecture"] = "rwkv"
    (tmp_path / "config.json").write_text(json.dumps(config))
    expect_error(tmp_path, "config.json", "unknown architecture 'rwkv'", "lstm", "gcnn", "transformer")


def test_unknown_hugging_face_model_type(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    expect_error(tmp_path, "config.json", "unsupported Hugging Face model_type 'bert'")


def test_config_that_is_not_json(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    expect_error(tmp_path, "config.json", "not valid JSON")


def test_config_with_unknown_field(tmp_path):
    write_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["config"]["n_wizards"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    expect_error(tmp_path, "config.json", "invalid model configuration", "n_wizards")


def test_missing_tensor(tmp_path):
    write_checkpoint(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["layers.1.mlp.down.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    expect_error(tmp_path, "model.safetensors", "missing tensor 'layers.1.mlp.down.weight'")


def test_misshapen_tensor(tmp_path):
    write_checkpoint(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["layers.0.attn.qkv.weight"] = tensors["layers.0.attn.qkv.weight"][:, :7].contiguous()
    save_file(tensors, tmp_path / "model.safetensors")
    expect_error(tmp_path, "model.safetensors", "layers.0.attn.qkv.weight", "(64, 7)", "expected (64, 32)")


def test_corrupt_weights_file(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    expect_error(tmp_path, "model.safetensors", "not a readable safetensors file")


def test_corrupt_tokenizer(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    expect_error(tmp_path, "tokenizer.json", "not a readable tokenizer")


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path):
    write_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["config"]["vocab_size"] = 100
    (tmp_path / "config.json").write_text(json.dumps(config))
    expect_error(tmp_path, "tokenizer.json", "tokenizer has 300 tokens", "only 100")


def test_pickle_is_never_loaded(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"embed.weight": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    expect_error(tmp_path, "model.safetensors", "missing file")


def test_a_float32_model_on_cuda_turns_cudnn_tf32_off(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    keep_float32_exact(torch.device("cuda", 0), torch.bfloat16)
    keep_float32_exact(torch.device("cpu"), torch.float32)
    assert torch.backends.cudnn.allow_tf32
    keep_float32_exact(torch.device("cuda", 0), torch.float32)
    assert not torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("has_bf16", [True, False])
@pytest.mark.parametrize("key, picks_bf16", [("transformer-gpt2", True), ("lstm", False), ("gcnn", False)])
def test_auto_on_the_cpu_picks_bfloat16_for_transformers_where_the_cpu_computes_in_it(
        tmp_path, monkeypatch, key, picks_bf16, has_bf16):
    """As vLLM does, and measured to pay (docs/performance.md); families not measured there stay float32."""
    from quill.models.kernels import narrow_weights
    from quill.models.loading import checkpoint

    for module in (checkpoint, narrow_weights):  # the choice, and whether bfloat16 weights are then narrowed
        monkeypatch.setattr(module, "cpu_has_bf16", lambda: has_bf16)
    write_checkpoint(tmp_path, key)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="auto")
    assert loaded.dtype == (torch.bfloat16 if picks_bf16 and has_bf16 else torch.float32)
    assert load_checkpoint(tmp_path, device="cpu", dtype="float32").dtype == torch.float32
