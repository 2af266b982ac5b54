"""Mamba-2 against transformers' Mamba2ForCausalLM on tiny random checkpoints (float32, CPU).

The full forward must match transformers'; a prompt cut into steps of any sizes, many sequences of different
lengths in one step, and a state copied to another slot must all give the full forward's logits; the engine's
greedy and beam search must give transformers' `generate` tokens.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.families import mamba2
from quill.models.families.mamba2 import GatedRMSNorm, Mamba2Config, Mamba2LanguageModel
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.hf_state_models import (assert_engine_beams_match, assert_engine_greedy_matches, assert_load_refused,
                                  edit_config, full_logits, greedy_by_forwards, step_side_by_side,
                                  step_through, tokens)
from tests.hf_state_models.mamba2 import VOCAB, save_tiny
from tests.server.engine.graph_emulation import EmulatedGraphs
from tests.server.engine.helpers import run_to_completion

TOL = dict(rtol=1e-5, atol=1e-5)
# The default tiny config (two groups, untied, conv bias) and one that changes every option transformers reads:
# tied embeddings, in/out projection biases, no conv bias, one group, a clamped dt, a float residual in the
# model's dtype, a narrower convolution.
VARIANTS = {
    "default": {},
    "options": dict(tie_word_embeddings=True, use_bias=True, use_conv_bias=False, n_groups=1,
                    time_step_limit=(0.02, 0.08), residual_in_fp32=False, conv_kernel=3),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_tiny(directory, **VARIANTS[request.param])
    return reference, load_checkpoint(directory, device="cpu", dtype="float32").model


def test_full_forward_matches_transformers(pair):
    reference, model = pair
    ids = torch.randint(0, VOCAB, (3, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference(ids).logits
    torch.testing.assert_close(model(ids), want, **TOL)


def test_scan_chunk_sets_the_prefill_scans_chunks_and_not_the_result(pair, monkeypatch):
    _, model = pair
    ids = torch.randint(0, VOCAB, (2, 29), generator=torch.Generator().manual_seed(3))
    want = model(ids)
    seen = []
    real = mamba2.ssd_chunked
    monkeypatch.setattr(mamba2, "ssd_chunked", lambda *args: seen.append(args[-1]) or real(*args))
    model.scan_chunk = 5
    try:
        got = model(ids)
    finally:
        model.scan_chunk = None
    assert seen and set(seen) == {5} and model.config.chunk_size != 5
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("sizes", [[1] * 26, [3] * 8 + [2], [7, 7, 7, 5], [26], [5, 1, 9, 2, 1, 8]],
                         ids=["ones", "threes", "sevens", "whole", "mixed"])
def test_a_prompt_in_steps_of_any_sizes_gives_the_full_forward(pair, sizes):
    _, model = pair
    ids = tokens(30, seed=2)
    state = model.new_state(3)
    got = step_through(model, state, 1, ids, sizes + [1])  # then single-token decode steps
    torch.testing.assert_close(got, full_logits(model, ids), **TOL)


def test_sequences_prefilling_and_decoding_in_one_step_give_each_alone(pair):
    _, model = pair
    # slot -> (its text, the tokens it brings to each step; 0: absent from that step)
    plans = {0: (tokens(19, 3), [1, 7, 1, 1, 9]), 2: (tokens(16, 4), [12, 1, 1, 1, 1]),
             3: (tokens(13, 5), [0, 3, 9, 1, 0]), 5: (tokens(6, 6), [2, 0, 0, 1, 3])}
    state = model.new_state(7)
    idle = torch.randn_like(state["ssm"][4]), torch.randn_like(state["conv"][4])
    state["ssm"][4], state["conv"][4] = idle
    got = step_side_by_side(model, state, plans)
    for slot, (text, _) in plans.items():
        torch.testing.assert_close(got[slot], full_logits(model, text), **TOL)
    assert torch.equal(state["ssm"][4], idle[0]) and torch.equal(state["conv"][4], idle[1])  # untouched


def test_a_copied_state_continues_like_a_fresh_prefill(pair):
    _, model = pair
    prefix, left, right = tokens(11, 7), tokens(6, 8), tokens(4, 9)
    state = model.new_state(4)
    step_through(model, state, 0, prefix, [5, 6])
    state.copy([0], [3])
    batch = StepBatch.build([left, right], [11, 11], slots=[0, 3], logits="all")
    got_left, got_right = model.step(batch, state).split([6, 4])
    torch.testing.assert_close(got_left, full_logits(model, prefix + left)[11:], **TOL)
    torch.testing.assert_close(got_right, full_logits(model, prefix + right)[11:], **TOL)


def test_a_bfloat16_conv_window_beside_float32_weights_keeps_its_dtype(pair):
    """new_state's dtype is the conv window's, whatever the weights': each step writes the window back in it."""
    _, model = pair
    ids = tokens(14, seed=11)
    state = model.new_state(1, dtype=torch.bfloat16)
    got = step_through(model, state, 0, ids, [8, 1])
    assert state["conv"].dtype == torch.bfloat16 and state["ssm"].dtype == torch.float32
    torch.testing.assert_close(got, full_logits(model, ids), atol=0.02, rtol=0)  # the window's rounding only


def test_decode_steps_and_prefill_chunks_leave_the_same_state(pair):
    _, model = pair
    ids = tokens(21, 10)
    state = model.new_state(2)
    step_through(model, state, 0, ids, [21])
    step_through(model, state, 1, ids, [1])
    for name in ("conv", "ssm"):
        torch.testing.assert_close(state[name][0], state[name][1], **TOL)


# ---- the engine against transformers' generate ---------------------------------------------------------

PROMPTS = [tokens(9, 11), tokens(3, 12), tokens(17, 13), [42]]


@pytest.fixture(scope="module")
def default_pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("engine")
    reference = save_tiny(directory)
    return reference, load_checkpoint(directory, device="cpu", dtype="float32")


def engine(loaded, graphs: bool = False) -> EngineCore:
    # A small token budget and snapshot interval: prompts are prefilled in chunks beside decoding sequences,
    # and prefix snapshots are copied between slots.
    return EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8),
                                           CacheConfig(block_size=4), enforce_eager=not graphs),
                      graph_capture=EmulatedGraphs() if graphs else None)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_engine_greedy_matches_transformers_generate(default_pair, graphs):
    reference, loaded = default_pair
    e = engine(loaded, graphs)
    assert_engine_greedy_matches(e, reference, PROMPTS + PROMPTS[:2],  # the repeats start from prefix snapshots
                                 SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
                                 max_new_tokens=10, min_new_tokens=10)
    assert e.cache.prefix_hits > 0  # some prompts did start from a copied snapshot


def test_engine_beam_search_matches_transformers_generate(default_pair):
    reference, loaded = default_pair
    e = engine(loaded)
    params = SamplingParams(max_tokens=6, use_beam_search=True, beam_width=3, n=2, ignore_eos=True)
    assert_engine_beams_match(e, reference, PROMPTS[:3], params, num_beams=3, max_new_tokens=6, min_new_tokens=6)


def test_engine_greedy_with_a_clamped_dt_matches_the_full_forward(tmp_path):
    """transformers' cached decode step skips the time_step_limit clamp that its full forward applies, so
    with a limit the reference is greedy decoding by full forwards."""
    reference = save_tiny(tmp_path, time_step_limit=(0.02, 0.08))
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    e = engine(loaded)
    for i, prompt in enumerate(PROMPTS[:2]):
        e.add_request(f"r{i}", prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS[:2]):
        assert results[f"r{i}"][0]["token_ids"] == greedy_by_forwards(reference, prompt, 6), i


# ---- configs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, option", [(dict(hidden_act="gelu"), "hidden_act"),
                                             (dict(rms_norm=False), "rms_norm")])
def test_an_option_quill_does_not_implement_is_refused(tmp_path, changes, option):
    save_tiny(tmp_path)
    assert_load_refused(tmp_path, option, **changes)


def test_config_norm_before_gate_is_read_as_transformers_reads_it(tmp_path):
    """Mamba-Codestral's config.json says norm_before_gate true; transformers ignores the key and gates first."""
    reference = save_tiny(tmp_path)
    edit_config(tmp_path, norm_before_gate=True, time_step_limit=[0.0, "Infinity"])
    model = load_checkpoint(tmp_path, device="cpu", dtype="float32").model
    assert model.config.norm_before_gate is False and model.config.time_step_limit == (0.0, float("inf"))
    ids = torch.tensor([tokens(12, 14)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids).logits, **TOL)


@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_gated_norm_orders(norm_before_gate):
    norm = GatedRMSNorm(8, n_groups=2, eps=1e-5, norm_before_gate=norm_before_gate)
    torch.nn.init.normal_(norm.weight)
    y, z = torch.randn(3, 8), torch.randn(3, 8)

    def rms(v):
        groups = v.view(3, 2, 4)
        return (groups / (groups.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).view(3, 8)

    gate = torch.nn.functional.silu(z)
    want = rms(y) * gate if norm_before_gate else rms(y * gate)
    torch.testing.assert_close(norm(y, z), norm.weight * want, **TOL)


def test_bytes_per_sequence_of_the_130m_shape():
    """The module docstring's figure: mamba2-130m keeps 19,390,464 bytes of float32 state per sequence."""
    config = Mamba2Config(vocab_size=50288, hidden_size=768, num_layers=24, expand=2, num_heads=24, head_dim=64,
                          state_size=128, n_groups=1, conv_kernel=4)
    with torch.device("meta"):
        state = Mamba2LanguageModel(config).new_state(1)
    assert state.bytes_per_slot == 19_390_464


def test_inconsistent_head_shapes_are_refused():
    with pytest.raises(ValueError, match="num_heads"):
        Mamba2Config(vocab_size=10, hidden_size=16, expand=2, num_heads=3, head_dim=8)
    with pytest.raises(ValueError, match="n_groups"):
        Mamba2Config(vocab_size=10, hidden_size=16, expand=2, num_heads=4, head_dim=8, n_groups=3)
