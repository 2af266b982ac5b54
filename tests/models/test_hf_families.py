"""Every Hugging Face family Quill serves equals transformers on a tiny random checkpoint:
full-forward logits within 1e-4 (float32), the paged incremental path too, and greedy
generation token for token. Loaded by hub id from an offline HF cache."""

from __future__ import annotations

import copy

import pytest
import torch

from quill.models.loading import hf
from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.hf_families import FAMILIES
from tests.conftest import TEST_DEVICE, on_test_device
from tests.hub_checkpoints import BUILDERS, V

HUB_IDS = list(BUILDERS)


@pytest.fixture(params=HUB_IDS, ids=lambda i: i.split("/")[1])
def pair(request, offline_hub):
    checkpoint = offline_hub[request.param]
    return on_test_device(checkpoint.reference), load_checkpoint(request.param, device=TEST_DEVICE, dtype="float32")


def test_full_forward_matches_transformers(pair):
    reference, loaded = pair
    tokens = torch.randint(0, V, (3, 40), generator=torch.Generator().manual_seed(2)).to(TEST_DEVICE)
    with torch.no_grad():
        expected = reference(tokens).logits
    got = loaded.model(tokens)
    assert expected.std() > 0.01  # a real signal, not a constant
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_incremental_decoding_matches_transformers(pair):
    reference, loaded = pair
    tokens = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(3)).to(TEST_DEVICE)
    with torch.no_grad():
        expected = reference(tokens).logits[0]
    cache = loaded.model.new_state(16, block_size=4)
    ids, table = tokens[0].tolist(), [list(range(10))]
    outs = [loaded.model.step(StepBatch.build([ids[:25]], [0], block_tables=table, logits="all", device=TEST_DEVICE),
                              cache)]
    for pos in range(25, 40):
        outs.append(loaded.model.step(StepBatch.build([[ids[pos]]], [pos], block_tables=table, device=TEST_DEVICE),
                                      cache))
    torch.testing.assert_close(torch.cat(outs), expected, atol=1e-4, rtol=0)


def quill_greedy(loaded, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding through the paged K,V cache: prefill, then one token per step."""
    cache = loaded.model.new_state(16, block_size=4)
    table = [list(range(16))]
    logits = loaded.model.step(StepBatch.build([prompt], [0], block_tables=table, device=TEST_DEVICE), cache)
    out = []
    for _ in range(steps):
        out.append(int(logits[-1].argmax()))
        position = len(prompt) + len(out) - 1
        logits = loaded.model.step(StepBatch.build([[out[-1]]], [position], block_tables=table, device=TEST_DEVICE),
                                   cache)
    return out


def test_greedy_generation_matches_transformers(pair):
    reference, loaded = pair
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(4)).tolist()
    steps = 30  # within every checkpoint's context, Mistral's 48-token window included
    expected = reference.generate(torch.tensor([prompt], device=TEST_DEVICE), do_sample=False, max_new_tokens=steps, eos_token_id=None,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    assert len(expected) == steps and len(set(expected)) > 3  # not stopped early, not one token repeated
    assert quill_greedy(loaded, prompt, steps) == expected


@pytest.mark.parametrize("hub_id", HUB_IDS, ids=lambda i: i.split("/")[1])
def test_bfloat16_is_as_close_to_transformers_as_rounding_allows(offline_hub, hub_id):
    """In bfloat16 both implementations round differently; ours may not stray further from
    transformers' bfloat16 logits than those stray from float32 ones."""
    reference = on_test_device(offline_hub[hub_id].reference)
    tokens = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(5)).to(TEST_DEVICE)
    with torch.no_grad():
        full = reference(tokens).logits
        half = copy.deepcopy(reference).to(torch.bfloat16)(tokens).logits.float()
    ours = load_checkpoint(hub_id, device=TEST_DEVICE, dtype="bfloat16").model(tokens)
    rounding = (half - full).abs().max()
    assert (ours - half).abs().max() <= 1.5 * rounding
    assert (ours - full).abs().max() <= 1.5 * rounding


@pytest.mark.parametrize("hub_id, model_type, switches", [
    ("quill-test/tiny-llama-chat", "llama", dict(qk_norm=False, attn_bias=False, embed_scale=1.0)),
    ("quill-test/tiny-mistral", "mistral", dict(max_seq_len=48)),  # the sliding window bounds the context
    ("quill-test/tiny-qwen2", "qwen2", dict(attn_bias=True, attn_out_bias=False, qk_norm=False)),
    ("quill-test/tiny-qwen3", "qwen3", dict(qk_norm=True, head_dim=16, attn_bias=True, attn_out_bias=True)),
    ("quill-test/tiny-phi3", "phi3", dict(norm="rmsnorm", activation="silu")),
    ("quill-test/tiny-gemma", "gemma", dict(norm="rmsnorm_unit_offset", activation="gelu_tanh",
                                            embed_scale=32**0.5, tie_embeddings=True, head_dim=16)),
])
def test_each_family_sets_its_switches(offline_hub, hub_id, model_type, switches):
    config = load_checkpoint(hub_id, device="cpu").model.config
    assert config.extra["hf_model_type"] == model_type
    assert {k: getattr(config, k) for k in switches} == switches


def test_family_registry_covers_the_issue_list():
    assert set(FAMILIES) == {"gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "lfm2", "mamba2",
                             "xlstm", "mamba", "falcon_mamba"}


LLAMA_RAW = dict(model_type="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=128)


@pytest.mark.parametrize("changes, fragment", [
    (dict(model_type="phi3", rope_scaling={"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}),
     "rope_scaling type must be one of ('default', 'linear', 'llama3'), not 'longrope'"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "not 'yarn'"),
    (dict(model_type="phi3", partial_rotary_factor=0.75), "partial rotary embeddings (partial_rotary_factor 0.75)"),
    (dict(model_type="gemma", use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(hidden_act="xielu"), "unsupported activation 'xielu'"),
    (dict(model_type="mixtral"), "unsupported Hugging Face model_type 'mixtral'"),
    (dict(vocab_size=None), "llama config has no 'vocab_size'"),
])
def test_configs_quill_cannot_serve_are_refused(changes, fragment):
    raw = {**LLAMA_RAW, **changes}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ValueError) as info:
        hf.config_from_hf(raw)
    assert fragment in str(info.value)


def test_sliding_window_bounds_the_context_only_where_it_is_used():
    mistral = dict(LLAMA_RAW, model_type="mistral", sliding_window=64)
    assert hf.config_from_hf(mistral)[0].max_seq_len == 64
    assert hf.config_from_hf(dict(mistral, sliding_window=None))[0].max_seq_len == 128
    assert hf.config_from_hf(dict(mistral, sliding_window=4096))[0].max_seq_len == 128
    qwen = dict(LLAMA_RAW, model_type="qwen2", sliding_window=64)  # Qwen2 uses it only when asked to
    assert hf.config_from_hf(qwen)[0].max_seq_len == 128
    assert hf.config_from_hf(dict(qwen, use_sliding_window=True))[0].max_seq_len == 64
    layers = dict(qwen, use_sliding_window=True, layer_types=["full_attention"] * 2)
    assert hf.config_from_hf(layers)[0].max_seq_len == 128


def test_family_defaults_fill_keys_a_config_leaves_out():
    config, _ = hf.config_from_hf(dict(LLAMA_RAW, model_type="gemma"))
    # GemmaConfig's defaults: tied embeddings, head_dim 256, tanh GELU
    assert config.tie_embeddings and config.head_dim == 256 and config.activation == "gelu_tanh"
    llama, _ = hf.config_from_hf(dict(LLAMA_RAW))
    assert not llama.tie_embeddings and llama.head_dim == 8 and llama.activation == "silu"
