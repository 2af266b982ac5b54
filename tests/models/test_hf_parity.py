"""Hugging Face GPT-2 and Llama directories load as they are and match `transformers`."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from tests.conftest import TEST_DEVICE, build_hf_tokenizer

V = 300

HF_CASES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, eos_token_id=0, bos_token_id=0)
    ),
    "llama-gqa": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, eos_token_id=0, bos_token_id=1,
        )
    ),
    "llama-tied-llama3-rope": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16},
            eos_token_id=[0, 2], bos_token_id=1,
        )
    ),
}


def save_hf(case: str, directory) -> torch.nn.Module:
    torch.manual_seed(0)
    model = HF_CASES[case]().eval()
    # Random init leaves norms at 1 and biases at 0; perturb them so the test sees them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    build_hf_tokenizer(V).save(str(directory / "tokenizer.json"))
    return model


@pytest.fixture(params=list(HF_CASES))
def hf_pair(request, tmp_path):
    reference = save_hf(request.param, tmp_path)
    return reference.to(TEST_DEVICE), load_checkpoint(tmp_path, device=TEST_DEVICE, dtype="float32")


def test_full_forward_matches_transformers(hf_pair):
    reference, loaded = hf_pair
    tokens = torch.randint(0, V, (3, 50), generator=torch.Generator().manual_seed(2)).to(TEST_DEVICE)
    with torch.no_grad():
        expected = reference(tokens).logits
    got = loaded.model(tokens)
    assert expected.std() > 0.01  # a real signal, not a constant
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_incremental_decoding_matches_transformers(hf_pair):
    reference, loaded = hf_pair
    tokens = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(3)).to(TEST_DEVICE)
    with torch.no_grad():
        expected = reference(tokens).logits[0]
    cache = loaded.model.new_state(16, block_size=4)
    ids = tokens[0].tolist()
    table, on = [list(range(10))], dict(device=TEST_DEVICE)
    outs = [loaded.model.step(StepBatch.build([ids[:25]], [0], block_tables=table, logits="all", **on), cache)]
    for pos in range(25, 40):
        outs.append(loaded.model.step(StepBatch.build([[ids[pos]]], [pos], block_tables=table, **on), cache))
    torch.testing.assert_close(torch.cat(outs), expected, atol=1e-4, rtol=0)


def test_config_mapping_reads_end_of_sequence_ids(tmp_path):
    save_hf("llama-tied-llama3-rope", tmp_path)
    loaded = load_checkpoint(tmp_path, device="cpu")
    assert loaded.eos_token_ids == [0, 2]
    assert loaded.tokenizer.eos_token_id == 0
    assert loaded.model.config.n_kv_heads == 1 and loaded.model.config.tie_embeddings


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_loads_close_to_float32(tmp_path, dtype):
    save_hf("llama-gqa", tmp_path)
    tokens = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(4)).to(TEST_DEVICE)
    full = load_checkpoint(tmp_path, device=TEST_DEVICE, dtype="float32").model(tokens)
    half = load_checkpoint(tmp_path, device=TEST_DEVICE, dtype=dtype)
    if half.weights_dtype is None:
        assert half.model.embed.weight.dtype == getattr(torch, dtype)
    else:  # bfloat16 on a CPU without its arithmetic: linear weights narrowed, the rest float32 (narrow_weights.py)
        assert (half.dtype, half.weights_dtype) == (torch.float32, torch.bfloat16)
        assert half.model.layers[0].attn.qkv.weight.dtype == torch.bfloat16
    torch.testing.assert_close(half.model(tokens), full, atol=0.1, rtol=0.05)
