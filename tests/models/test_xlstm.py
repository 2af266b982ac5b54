"""xLSTM against transformers' xLSTMForCausalLM, and its state carried exactly through steps of any shape."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.hf import config_from_hf
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.hf_state_models import (assert_engine_beams_match, assert_engine_greedy_matches, assert_load_refused,
                                  full_logits, step_side_by_side, step_through, tokens)
from tests.hf_state_models.xlstm import V, save_tiny

CHUNK = 16  # the tiny checkpoint's chunk_size: prompts below cross several chunkwise pieces


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xlstm")
    return save_tiny(directory), load_checkpoint(directory, device="cpu", dtype="float32")


# Float32 rounding moves this tiny model's logits by up to 1.4e-4 from float64's (24 random sequences; the per-head
# layer norm scales up the rounding of memory reads that cancel), in our paths and in transformers' alike (its
# chunkwise, recurrent and cached paths differ by as much). In float64 every path agrees to the logits' own
# float32 rounding: that is the test of exactness.
FLOAT32_NOISE = 2e-4
TOLERANCE = {torch.float32: FLOAT32_NOISE, torch.float64: 1e-6}


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["float32", "float64"])
def model(pair, request):
    return copy.deepcopy(pair[1].model).to(request.param)


def close(got: torch.Tensor, want: torch.Tensor, model) -> None:
    torch.testing.assert_close(got, want, atol=TOLERANCE[model.lm_head.weight.dtype], rtol=0)


def run(model, state, slots: list[int], new: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
    """One step of `new` tokens per slot; every row's logits, split per sequence."""
    batch = StepBatch.build(new, starts, slots=slots, logits="all")
    return list(model.step(batch, state).split(batch.query_lens))


# ---- (1) full forward = transformers' --------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 3 * CHUNK + 7])
def test_full_forward_matches_transformers(pair, length):
    reference, loaded = pair
    ids = torch.tensor([tokens(length, 1), tokens(length, 2)])
    with torch.no_grad():
        want = reference(ids, use_cache=False).logits
    torch.testing.assert_close(loaded.model(ids), want, atol=FLOAT32_NOISE, rtol=0)


@pytest.mark.parametrize("changes", [{}, {"weight_mode": "fused", "use_bias": True, "ffn_proj_factor": 1.3}],
                         ids=["single", "fused-bias"])
def test_same_function_as_transformers_in_float64(tmp_path, changes):
    """In float64 the two agree to the logits' float32 rounding: the same function, not a near one. A length that
    is a multiple of chunk_size: transformers' recurrent remainder keeps its state in float32 whatever the model's
    dtype; and its norms reduce in float32 unless told not to."""
    reference = save_tiny(tmp_path, norm_reduction_force_float32=False, **changes)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    reference.backbone.out_norm.force_float32_reductions = False  # this one ignores the config
    ids = torch.tensor([tokens(2 * CHUNK, 3)])
    with torch.no_grad():
        want = reference.double()(ids, use_cache=False).logits
        got = copy.deepcopy(loaded.model).double()(ids)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_each_of_transformers_paths_is_the_float64_function_to_float32_noise(pair):
    """Its chunkwise form (with the recurrence for the remainder), its recurrence alone and its cached steps all
    give the float64 function's logits to float32 noise, so its full forward is a fair reference (they differ from
    each other by up to twice that)."""
    reference = copy.deepcopy(pair[0])
    ids = torch.tensor([tokens(2 * CHUNK + 5, 4)])

    def with_chunk_size(size):
        reference.config.chunk_size = size
        for block in reference.backbone.blocks:
            block.mlstm_layer.mlstm_backend.__init__(reference.config)
        return reference(ids, use_cache=False).logits

    with torch.no_grad():
        truth = copy.deepcopy(pair[1].model).double()(ids)
        chunkwise, recurrent = with_chunk_size(CHUNK), with_chunk_size(1024)
        with_chunk_size(CHUNK)
        out = reference(ids[:, :9], use_cache=True)
        steps = [out.logits] + [reference(ids[:, t : t + 1], cache_params=out.cache_params, use_cache=True).logits
                                for t in range(9, ids.shape[1])]
    for logits in (chunkwise, recurrent, torch.cat(steps, 1)):
        torch.testing.assert_close(logits, truth, atol=FLOAT32_NOISE, rtol=0)


# ---- (2) chunks of any size through a slot = one full pass -----------------------------------------------------

CHUNKINGS = {"ones": [1], "threes": [3], "sevens": [7], "whole": [1000], "mixed": [5, 1, CHUNK + 3, 2, 9, 1, 30]}


@pytest.mark.parametrize("sizes", list(CHUNKINGS.values()), ids=list(CHUNKINGS))
def test_prompt_in_chunks_then_single_steps_equal_full_forward(model, sizes):
    seq = tokens(3 * CHUNK + 5, 5)
    prompt, rest = seq[:-6], seq[-6:]
    state = model.new_state(4)
    got = [step_through(model, state, 2, prompt, sizes)]
    for i, token in enumerate(rest):
        got += run(model, state, [2], [[token]], [len(prompt) + i])
    close(torch.cat(got), full_logits(model, seq), model)


def state_tolerance(model) -> dict:
    weight = model.lm_head.weight
    if weight.dtype != torch.float32:
        return dict(atol=1e-12, rtol=1e-9)
    # A chunk's matmul sums in another order than one token's, by how many threads and which vector units the
    # machine has: a few elements of float32 states were 4e-6 apart on a 16-core host (and on the H100)
    return dict(atol=1e-5, rtol=1e-4)


def test_a_chunk_leaves_the_state_one_full_pass_leaves(model):
    seq = tokens(2 * CHUNK + 3, 6)
    one, many = model.new_state(1), model.new_state(1)
    step_through(model, one, 0, seq, [1000])
    step_through(model, many, 0, seq, [1])
    for name, tensor in one.tensors.items():
        torch.testing.assert_close(tensor, many[name], **state_tolerance(model))
    assert one["C"].dtype == model.lm_head.weight.dtype and one["C"].abs().sum() > 0


# ---- (3) a step mixing sequences = each alone ------------------------------------------------------------------


def test_mixed_batch_of_prefills_and_decodes_equals_each_alone(model):
    lengths = [2 * CHUNK + 9, 4, 25, 1, 13]
    seqs = [tokens(n, 10 + i) for i, n in enumerate(lengths)]
    chunk_of = [CHUNK + 5, 1, 7, 1, 3]  # per sequence: its tokens per step
    slots = [6, 0, 3, 5, 1]  # not in order, some slots left idle
    state = model.new_state(8)
    got = step_side_by_side(model, state, {slot: (seq, [n]) for slot, seq, n in zip(slots, seqs, chunk_of)})
    for slot, seq in zip(slots, seqs):
        close(got[slot], full_logits(model, seq), model)
    assert state["C"][[2, 4, 7]].abs().sum() == 0  # idle slots untouched


def test_padding_does_not_change_a_short_sequences_state(model):
    """A two-token sequence padded to a long chunk's length: its slot holds what its two tokens alone leave."""
    long, short = tokens(CHUNK + 11, 20), tokens(2, 21)
    together, alone = model.new_state(2), model.new_state(2)
    run(model, together, [0, 1], [long, short], [0, 0])
    run(model, alone, [1], [short], [0])
    for name in together.tensors:
        torch.testing.assert_close(together[name][1], alone[name][1], **state_tolerance(model))


# ---- (4) a copied state continues as a fresh prefill would ------------------------------------------------------


def test_copied_state_continues_like_a_fresh_prefill(model):
    prefix, tail_a, tail_b = tokens(CHUNK + 6, 30), tokens(9, 31), tokens(4, 32)
    state = model.new_state(4)
    step_through(model, state, 0, prefix, [7])
    state.copy([0], [3])  # fork: slot 3 continues from where slot 0 is
    a, b = run(model, state, [0, 3], [tail_a, tail_b], [len(prefix), len(prefix)])
    close(a, full_logits(model, prefix + tail_a)[len(prefix):], model)
    close(b, full_logits(model, prefix + tail_b)[len(prefix):], model)


def test_bfloat16_model_keeps_a_float32_state():
    from quill.models.families.xlstm import XLSTMConfig, XLSTMLanguageModel

    torch.manual_seed(0)
    model = XLSTMLanguageModel(XLSTMConfig(vocab_size=V, d_model=64, n_blocks=1, n_heads=2)).to(torch.bfloat16)
    state = model.new_state(2)
    logits = torch.cat(run(model, state, [1], [tokens(20, 40)], [0]))
    assert state["C"].dtype == torch.float32 and logits.dtype == torch.float32 and logits.isfinite().all()


# ---- (5) the engine's greedy and beam search = transformers' generate -------------------------------------------

PROMPTS = [[10, 20, 30, 40, 50], [7, 8, 9], list(range(100, 100 + CHUNK + 5)), [42]]


@pytest.fixture(scope="module")
def sharp_pair(pair):
    """Both models with the logits scaled up, so that greedy paths are not ties of noise."""
    reference, loaded = copy.deepcopy(pair)
    with torch.no_grad():
        for model in (reference, loaded.model):
            model.lm_head.weight.mul_(8.0)
    return reference, loaded


def engine(loaded) -> EngineCore:
    return EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16),
                                           CacheConfig(block_size=4)))


def test_engine_greedy_matches_transformers_generate(sharp_pair):
    reference, loaded = sharp_pair
    e = engine(loaded)
    assert_engine_greedy_matches(e, reference, PROMPTS + PROMPTS[2:],  # the repeat starts from a copied snapshot
                                 SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                                 max_new_tokens=12, min_new_tokens=12)
    assert e.cache.prefix_hits > 0 and e.cache.usage == 0


def test_engine_beam_search_matches_transformers_generate(sharp_pair):
    """transformers cannot reorder an xLSTM cache, so its beam search recomputes every step from the start."""
    reference, loaded = sharp_pair
    e = engine(loaded)
    params = SamplingParams(max_tokens=8, use_beam_search=True, beam_width=3, n=2, ignore_eos=True)
    assert_engine_beams_match(e, reference, PROMPTS[:2], params, num_beams=3, max_new_tokens=8, min_new_tokens=8,
                              use_cache=False)
    assert e.cache.usage == 0


# ---- (6) options Quill does not implement are refused ----------------------------------------------------------


def config_json(**changes) -> dict:
    return {"model_type": "xlstm", "vocab_size": V, "hidden_size": 128, "num_heads": 4, **changes}


@pytest.mark.parametrize("changes, words", [
    ({"weight_mode": "stacked"}, "weight_mode"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"add_out_norm": False}, "add_out_norm"),
    ({"embedding_dim": 64}, "embedding_dim 64 differs from hidden_size 128"),
    ({"mode": "bidirectional"}, "mode"),
    ({"num_heads": 3}, "num_heads 3"),
])
def test_unsupported_options_are_refused(changes, words):
    with pytest.raises(ValueError, match=words):
        config_from_hf(config_json(**changes))


def test_the_7b_shape_reads_with_transformers_defaults_and_its_state_size():
    from quill.models.families.xlstm import XLSTMLanguageModel

    config, _ = config_from_hf({"model_type": "xlstm", "embedding_dim": 4096, "num_blocks": 32,
                                "chunkwise_kernel": "chunkwise--triton_xl_chunk", "step_kernel": "triton"})
    assert (config.d_model, config.n_blocks, config.n_heads, config.qk_dim, config.v_dim, config.ffn_dim) == (
        4096, 32, 8, 2048, 4096, 10944)
    with torch.device("meta"):
        model = XLSTMLanguageModel(config).to(torch.bfloat16)
    assert model.new_state(1).bytes_per_slot == 32 * 8 * (256 * 512 + 256 + 1) * 4 == 134_480_896  # float32
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(6.87e9, rel=0.01)


def test_a_refused_checkpoint_fails_to_load_naming_the_option(tmp_path):
    save_tiny(tmp_path)
    assert_load_refused(tmp_path, "tie_word_embeddings", tie_word_embeddings=True)


def test_decode_steps_replayed_as_graphs_give_the_eager_answers(sharp_pair):
    """The decode step is capturable: as real CUDA graphs on a GPU, and under the CPU emulation (which refuses host
    syncs in capture), the engine answers as it does eagerly."""
    from tests.server.engine.test_graphs import (ARRIVALS, assert_same_answers, make_engine, on_test_device,
                                                 record_replays, run_arrivals)

    loaded, arrivals = on_test_device(sharp_pair[1]), ARRIVALS[:4]  # greedy, seeded, beams, n=2: buckets 1 to 8
    expected = run_arrivals(make_engine(loaded, graphs=False, max_num_seqs=8), arrivals)
    engine = make_engine(loaded, graphs=True, max_num_seqs=8)
    replays = record_replays(engine)
    assert_same_answers(run_arrivals(engine, arrivals), expected)
    assert any(real < size for real, size in replays), replays  # replayed, with padding rows
