"""LFM2 against transformers' Lfm2ForCausalLM, and its hybrid state (conv windows in slots, K,V in blocks) carried
exactly through chunked prefill, mixed steps, forks and the engine's greedy and beam search."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quill.models.loading import hf
from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.hf_families import FAMILIES
from quill.models.families.lfm2 import Lfm2LanguageModel
from quill.models.state import HybridState
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.fake_cuda import CUDA, assert_on_cuda, fake_cuda, fake_model
from tests.hf_state_models import assert_beams_match, assert_load_refused, full_logits, tokens
from tests.hf_state_models.lfm2 import TINY, V, save_tiny
from tests.server.engine.graph_emulation import EmulatedGraphs, HostSyncGuard
from tests.server.engine.helpers import run_to_completion

BLOCK = 4
TOLERANCE = dict(atol=3e-5, rtol=0)  # float32 rounding of logits that span about -5..5: up to 1.2e-5 seen
# Variants the step tests run on: the default mix, and the two edges (no attention layer, no conv layer).
VARIANTS = {
    "hybrid": {},
    "all-conv": dict(full_attn_idxs=[]),
    "all-attention": dict(full_attn_idxs=[0, 1, 2, 3, 4]),
}


def blocks_of(seq: int, length: int, stride: int = 8) -> list[int]:
    """Sequence `seq`'s blocks, interleaved with the other sequences' (seq, seq + stride, ...)."""
    return [seq + stride * j for j in range(-(-length // BLOCK))]


def step(model, state, chunks: list[list[int]], starts: list[int], slots: list[int], seqs: list[int]) -> torch.Tensor:
    """One step over sequences `seqs` (their blocks from blocks_of), each with a chunk from `starts`."""
    tables = [blocks_of(s, start + len(c)) for s, start, c in zip(seqs, starts, chunks)]
    batch = StepBatch.build(chunks, starts, slots=slots, block_tables=tables, logits="all")
    return model.step(batch, state)


def run_chunks(model, state, ids: list[int], sizes: list[int], slot: int = 0, seq: int = 0,
               start: int = 0) -> torch.Tensor:
    """Feed `ids` (from position `start`) in chunks of `sizes`, one sequence a step; the logits of every row."""
    rows = []
    for size in sizes:
        rows.append(step(model, state, [ids[:size]], [start], [slot], [seq]))
        ids, start = ids[size:], start + size
    return torch.cat(rows)


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    """(transformers model, our loaded model) of one variant."""
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_tiny(directory, **VARIANTS[request.param])
    return reference, load_checkpoint(directory, device="cpu", dtype="float32").model


@pytest.mark.parametrize("changes", [
    {}, dict(tie_word_embeddings=False, conv_bias=True), dict(conv_L_cache=4, full_attn_idxs=[0, 2]),
    dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
], ids=["tiny", "untied-conv-bias", "kernel-4", "linear-rope"])
def test_full_forward_matches_transformers(tmp_path, changes):
    reference = save_tiny(tmp_path, **changes)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    assert loaded.architecture == "lfm2" and loaded.max_seq_len == 256
    assert (loaded.model.lm_head is None) == reference.config.tie_word_embeddings
    batch = torch.randint(0, V, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference(batch).logits
    torch.testing.assert_close(loaded.model(batch), want, **TOLERANCE)


@pytest.mark.parametrize("sizes", [[1] * 23, [3] * 8, [7] * 4, [23], [5, 1, 9, 2, 6]],
                         ids=["ones", "threes", "sevens", "whole", "mixed"])
def test_chunked_prefill_then_decode_equals_full_forward(pair, sizes):
    _, model = pair
    ids = tokens(27, seed=3)
    state = model.new_state(num_blocks=8 * 8, num_slots=3)
    prefill = run_chunks(model, state, ids[:23], sizes, slot=2, seq=1)
    decode = run_chunks(model, state, ids[23:], [1] * 4, slot=2, seq=1, start=23)  # then single-token steps
    got = torch.cat([prefill, decode])
    torch.testing.assert_close(got, full_logits(model, ids), **TOLERANCE)


def test_mixed_step_equals_each_sequence_alone(pair):
    """Four sequences in non-adjacent slots and interleaved blocks, each with its own chunking: steps mix fresh
    prefills, continued prefills from a saved state and single-token decodes."""
    _, model = pair
    plans = {0: [6, 1, 1, 1], 1: [2, 5, 3, 1], 2: [1, 1, 9, 1], 3: [4, 4, 1, 7]}  # sequence -> chunk per step
    slots = {0: 5, 1: 0, 2: 3, 3: 2}
    texts = {s: tokens(sum(plan), seed=10 + s) for s, plan in plans.items()}
    state = model.new_state(num_blocks=8 * 8, num_slots=6)
    done = {s: 0 for s in plans}
    got = {s: [] for s in plans}
    for n in range(4):
        seqs = [s for s in plans if n < len(plans[s])]
        chunks = [texts[s][done[s] : done[s] + plans[s][n]] for s in seqs]
        logits = step(model, state, chunks, [done[s] for s in seqs], [slots[s] for s in seqs], seqs)
        for s, rows in zip(seqs, logits.split([len(c) for c in chunks])):
            got[s].append(rows)
            done[s] += plans[s][n]
    for s, text in texts.items():
        torch.testing.assert_close(torch.cat(got[s]), full_logits(model, text), **TOLERANCE)


def test_forked_state_continues_like_a_fresh_prefill(pair):
    """Fork after 10 tokens (mid-block): copy the slot and the K,V blocks; both branches go on their own way."""
    _, model = pair
    prefix, left, right = tokens(10, seed=20), tokens(6, seed=21), tokens(4, seed=22)
    state = model.new_state(num_blocks=8 * 8, num_slots=4)
    run_chunks(model, state, prefix, [4, 6], slot=1, seq=0)
    state.slots.copy([1], [3])
    state.kv.copy_blocks(blocks_of(0, 10), blocks_of(2, 10))
    left_rows = run_chunks(model, state, left, [2, 1, 3], slot=1, seq=0, start=10)
    right_rows = run_chunks(model, state, right, [1, 3], slot=3, seq=2, start=10)
    torch.testing.assert_close(left_rows, full_logits(model, prefix + left)[10:], **TOLERANCE)
    torch.testing.assert_close(right_rows, full_logits(model, prefix + right)[10:], **TOLERANCE)


def test_decode_step_has_no_host_sync(pair):
    """What CUDA graph capture refuses (reading device values, tensors from host data) is absent from a decode
    step, once its batch is built."""
    _, model = pair
    state = model.new_state(num_blocks=8 * 8, num_slots=3)
    run_chunks(model, state, tokens(9, seed=30), [9], slot=0, seq=0)
    batch = StepBatch.build([[7], [8]], [9, 0], slots=[0, 1], block_tables=[blocks_of(0, 10), blocks_of(1, 1)])
    with HostSyncGuard():
        model.step(batch, state)


def test_steps_stay_on_cuda_in_bfloat16():
    """Under fake CUDA tensors: a mixed step and a decode step keep every tensor on the device, in bf16."""
    raw = {**FAMILIES["lfm2"].defaults, **TINY, "model_type": "lfm2"}
    with fake_cuda():
        model = fake_model(Lfm2LanguageModel, hf.config_from_hf(raw)[0], torch.bfloat16)
        state = model.new_state(num_blocks=16, num_slots=3, block_size=BLOCK)
        assert_on_cuda(state.kv.k, state.kv.v, state.slots["conv"])
        assert state.slots["conv"].dtype == torch.bfloat16
        tables = [blocks_of(0, 9, stride=3), blocks_of(1, 9, stride=3), blocks_of(2, 9, stride=3)]
        for chunks, starts in [([[5] * 6, [7] * 2, [9]], [0, 0, 0]), ([[1], [2], [3]], [6, 2, 1])]:
            batch = StepBatch.build(chunks, starts, slots=[2, 0, 1], block_tables=tables, logits="all", device=CUDA)
            logits = model.step(batch, state)
            assert_on_cuda(logits)
            assert logits.shape == (batch.num_tokens, V) and logits.dtype == torch.float32


def test_new_state_holds_attention_kv_and_conv_windows(pair):
    _, model = pair
    c = model.config
    state = model.new_state(num_blocks=5, num_slots=7, block_size=BLOCK, dtype=torch.bfloat16)
    assert isinstance(state, HybridState) and state.kv.block_size == BLOCK
    assert state.kv.k.shape == (c.n_attention_layers, 5, BLOCK, c.n_kv_heads, c.head_dim)
    assert state.slots["conv"].shape == (7, c.n_conv_layers, c.conv_kernel - 1, c.d_model)
    assert state.kv.bytes_per_token == c.n_attention_layers * 2 * c.n_kv_heads * c.head_dim * 2
    assert state.slots.bytes_per_slot == c.n_conv_layers * (c.conv_kernel - 1) * c.d_model * 2


# LFM2-350M's config.json, in the older key names the released checkpoints use (block_ff_dim, full_attn_idxs).
LFM2_350M = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 1024,
    "block_ff_dim": 6656, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
    "num_hidden_layers": 16, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "num_attention_heads": 16,
    "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False, "norm_eps": 1e-5, "rope_theta": 1000000.0,
    "max_position_embeddings": 128000, "eos_token_id": 7, "bos_token_id": 1, "pad_token_id": 0,
}


def test_lfm2_350m_config_and_state_sizes():
    """The docstring's numbers: 40 KiB of conv windows per sequence and 12 KiB of K,V per token in bf16."""
    config, eos = hf.config_from_hf(LFM2_350M)
    assert (config.d_ff, config.head_dim, config.n_conv_layers, config.max_seq_len) == (4608, 64, 10, 128000)
    assert eos == [7] and config.tie_embeddings and config.rope_theta == 1e6
    assert config.layer_types == transformers.Lfm2Config(**LFM2_350M).layer_types
    with torch.device("meta"):
        model = Lfm2LanguageModel(config)
    assert model.layers[0].feed_forward.up.weight.shape == (2 * 4608, 1024)  # w1 and w3, fused
    state = model.new_state(num_blocks=1, num_slots=1, dtype=torch.bfloat16, attention_backend="sdpa")
    assert state.slots.bytes_per_slot == 40_960 and state.kv.bytes_per_token == 12_288


@pytest.mark.parametrize("changes, refused", [
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "rope_scaling type .* 'yarn'"),
    (dict(layer_types=["conv", "sliding_attention", "conv", "conv", "full_attention"]), "sliding_attention"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
], ids=["yarn-rope", "sliding-attention", "partial-rotary"])
def test_unimplemented_options_are_refused(tmp_path, changes, refused):
    save_tiny(tmp_path)
    assert_load_refused(tmp_path, refused, **changes)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated-graphs"])
def test_engine_greedy_and_beam_search_match_transformers(tmp_path, graphs):
    """EngineCore over the hybrid state (slots and blocks, prefix reuse between requests with one prompt), eagerly
    and with decode steps replayed as (emulated) CUDA graphs, against transformers' generate."""
    eos = 5  # a common token, so that some sequences really end on it
    reference = save_tiny(tmp_path, eos_token_id=eos, pad_token_id=eos)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    capture = EmulatedGraphs() if graphs else None
    engine = EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=16),
                                             CacheConfig(block_size=BLOCK, num_blocks=128)), graph_capture=capture)
    prompts = [tokens(5, seed=40), tokens(3, seed=41), tokens(13, seed=42), tokens(1, seed=43)]
    beam = dict(num_beams=3, n=2, length_penalty=1.0, early_stopping=False, max_new_tokens=8)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"greedy{i}", prompt, SamplingParams(max_tokens=10, temperature=0))
        engine.add_request(f"beam{i}", prompt, SamplingParams(
            max_tokens=beam["max_new_tokens"], use_beam_search=True, beam_width=beam["num_beams"], n=beam["n"],
            length_penalty=beam["length_penalty"], early_stopping=beam["early_stopping"]))
    results = run_to_completion(engine)
    for i, prompt in enumerate(prompts):
        greedy = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10)
        assert results[f"greedy{i}"][0]["token_ids"] == greedy[0, len(prompt):].tolist()
        assert len(results[f"beam{i}"]) == beam["n"]
        assert_beams_match(results[f"beam{i}"], reference, prompt, eos=eos, num_beams=beam["num_beams"],
                           length_penalty=beam["length_penalty"], early_stopping=beam["early_stopping"],
                           max_new_tokens=beam["max_new_tokens"])
    assert engine.cache.usage == 0
    if graphs:  # the capture went through (a failed one falls back to eager steps) and decode steps replayed it
        assert sum(capture.replays.values()) > 0
