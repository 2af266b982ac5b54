"""Mamba-1 and Falcon-Mamba against transformers on tiny random checkpoints (float32, CPU).

transformers' full uncached forward is the reference: its cached path drifts (about 1.6e-3) when it continues
several tokens from its cache, while Quill's steps must carry the state exactly, through chunks of any size, in
one batch with other sequences, and through a slot copy.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.hf import config_from_hf
from quill.models.families.mamba import MambaConfig, MambaLanguageModel
from quill.models.families.mamba_scan import chunk_length, selective_scan
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.hf_state_models import (assert_engine_beams_match, assert_engine_greedy_matches, assert_load_refused,
                                  full_logits, step_side_by_side, step_through, tokens)
from tests.hf_state_models.mamba import MODEL_TYPES, V, save_tiny
from tests.server.engine.graph_emulation import EmulatedGraphs, HostSyncGuard

ATOL = 2e-5
EOS = 5  # the tiny config's eos_token_id


@pytest.fixture(scope="module", params=MODEL_TYPES)
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_tiny(directory, model_type=request.param)
    return reference, load_checkpoint(directory, device="cpu", dtype="float32")


@pytest.fixture(params=[None, 5], ids=["device_scan", "chunked_scan"])
def scan(request, pair):
    """The prefill scan as the device runs it (on a CPU: a loop over the tokens), or in chunks of 5 (as on a GPU)."""
    pair[1].model.scan_chunk = request.param
    yield request.param
    pair[1].model.scan_chunk = None


@pytest.mark.parametrize("length", [1, 12, 100])
def test_full_forward_matches_transformers(pair, scan, length):
    reference, loaded = pair
    batch = torch.randint(0, V, (3, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = reference(batch).logits
    got = loaded.model(batch)
    assert expected.std() > 0.1
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


CHUNKINGS = {"ones": [1] * 50, "threes": [3] * 16, "sevens": [7] * 7, "whole": [50], "mixed": [5, 1, 20, 7, 1, 3, 13]}


# Chunks of up to 5 tokens scan as one chunk either way: the chunked scan only where chunks are longer.
CASES = [(name, None) for name in CHUNKINGS] + [(name, 5) for name in ("sevens", "whole", "mixed")]


@pytest.mark.parametrize("chunking, scan", CASES, indirect=["scan"],
                         ids=[f"{name}-{'chunked_scan' if s else 'device_scan'}" for name, s in CASES])
def test_chunked_prefill_then_decode_equals_full_forward(pair, scan, chunking):
    _, loaded = pair
    ids = tokens(60, seed=1)  # 50 prompt tokens in chunks, then 10 decode steps
    expected = full_logits(loaded.model, ids)
    state = loaded.model.new_state(4)
    got = step_through(loaded.model, state, 2, ids, CHUNKINGS[chunking] + [1])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert not state["ssm"][[0, 1, 3]].any() and not state["conv"][[0, 1, 3]].any()  # other slots untouched


def test_mixed_batch_equals_each_sequence_alone(pair, scan):
    """Sequences prefilling chunks of various sizes and sequences decoding, in one StepBatch per step."""
    _, loaded = pair
    texts = [tokens(n, seed=10 + n) for n in (41, 23, 34, 9)]
    plans = [[17, 1, 1, 8, 1, 13], [1, 1, 1, 20], [5, 29], [9]]  # then one token a step
    slots = [3, 0, 5, 1]
    got = step_side_by_side(loaded.model, loaded.model.new_state(6),
                            {slot: (text, plan + [1]) for slot, text, plan in zip(slots, texts, plans)})
    for slot, text in zip(slots, texts):
        torch.testing.assert_close(got[slot], full_logits(loaded.model, text), atol=ATOL, rtol=0)


def test_copied_slot_continues_like_a_fresh_prefill(pair, scan):
    _, loaded = pair
    prefix, left, right = tokens(19, seed=4), tokens(11, seed=5), tokens(6, seed=6)
    state = loaded.model.new_state(5)
    step_through(loaded.model, state, 1, prefix, [19])
    state.copy([1], [4])
    continued = {slot: step_through(loaded.model, state, slot, text, [4, 1], start=len(prefix))
                 for slot, text in ((1, left), (4, right))}
    for slot, text in ((1, left), (4, right)):
        expected = full_logits(loaded.model, prefix + text)[len(prefix):]
        torch.testing.assert_close(continued[slot], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("length", [1, 2, 7, 16, 33])
def test_chunked_scan_equals_token_loop(length):
    """Chunks of any length give the token loop's outputs and end state; tokens with dt 0 change nothing."""
    gen = torch.Generator().manual_seed(length)
    rows, num_tokens, d_inner, d_state = 3, 41, 6, 4
    u, B, C = (torch.randn(rows, num_tokens, n, generator=gen) for n in (d_inner, d_state, d_state))
    dt = torch.rand(rows, num_tokens, d_inner, generator=gen)
    dt[1, 30:] = 0  # row 1 ends at token 30: the rest is padding
    A = -torch.rand(d_inner, d_state, generator=gen) * 4
    start = torch.randn(rows, d_inner, d_state, generator=gen)
    want_y, want_state = selective_scan(u, dt, A, B, C, start, length=num_tokens)
    y, state = selective_scan(u, dt, A, B, C, start, length=length)
    torch.testing.assert_close(y, want_y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, want_state, atol=1e-5, rtol=1e-5)
    _, after_30 = selective_scan(u[1:2, :30], dt[1:2, :30], A, B[1:2, :30], C[1:2, :30], start[1:2], length=length)
    torch.testing.assert_close(state[1:2], after_30, atol=1e-5, rtol=1e-5)


def test_steps_stay_on_cuda():
    """bfloat16 steps on (fake) CUDA, where a long prefill runs the chunked scan: devices, shapes and dtypes."""
    from tests.fake_cuda import CUDA, assert_on_cuda, fake_cuda, fake_model

    assert chunk_length(40, torch.device("cuda")) < 20  # several chunks, the last one partly padding
    with fake_cuda():
        model = fake_model(MambaLanguageModel, MambaConfig(vocab_size=V, d_model=16, n_layers=1, d_state=4,
                                                          d_inner=32, dt_rank=2), torch.bfloat16)
        state = model.new_state(3)
        batch = StepBatch.build([[7] * 40, [8] * 3, [9]], [0, 0, 5], slots=[0, 1, 2], logits="all", device=CUDA)
        logits = model.step(batch, state)
        assert_on_cuda(logits, *state.tensors.values())
        assert logits.shape == (44, V) and logits.dtype == torch.float32
        assert state["ssm"].dtype == torch.float32 and state["conv"].dtype == torch.bfloat16
        state.copy([0], [2])  # a fork, then a decode step (the path CUDA graphs capture)
        logits = model.step(StepBatch.build([[1], [2], [3]], [40, 3, 40], slots=[0, 1, 2], device=CUDA), state)
        assert_on_cuda(logits, *state.tensors.values())
        assert logits.shape == (3, V)


def test_decode_step_has_no_host_sync(pair):
    """What CUDA graph capture refuses (reading device values, tensors from host data) is absent from a decode
    step, once its batch is built."""
    _, loaded = pair
    state = loaded.model.new_state(3)
    step_through(loaded.model, state, 0, tokens(9, seed=30), [9])
    batch = StepBatch.build([[7], [8]], [9, 0], slots=[0, 1])
    with HostSyncGuard():
        loaded.model.step(batch, state)


# ---- engine ------------------------------------------------------------------------------------------

PROMPTS = [[10, 20, 30, 40, 50], [7, 8, 9], tokens(37, seed=8), [42]]


def engine(loaded, graphs: bool = False) -> EngineCore:
    # A budget of 16 tokens: the 37-token prompt is prefilled in chunks, beside other sequences' decodes.
    config = EngineConfig(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=16),
                          CacheConfig(block_size=4, num_blocks=64), enforce_eager=not graphs)
    return EngineCore(loaded, config, graph_capture=EmulatedGraphs() if graphs else None)


def add_neighbours(e: EngineCore) -> None:
    """Sampled traffic that shares prefixes with the tested prompts (prefix snapshots, slot copies)."""
    for i in range(3):
        e.add_request(f"noise{i}", PROMPTS[i] + [i + 1] * (i + 2),
                      SamplingParams(max_tokens=4 + 3 * i, temperature=0.9, n=1 + i % 2, seed=i))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_engine_greedy_matches_transformers(pair, graphs):
    reference, loaded = pair
    e = engine(loaded, graphs)
    add_neighbours(e)
    assert_engine_greedy_matches(e, reference, PROMPTS, SamplingParams(max_tokens=10, temperature=0),
                                 max_new_tokens=10, use_cache=False)


def test_engine_beam_search_matches_transformers(pair):
    reference, loaded = pair
    e = engine(loaded)
    add_neighbours(e)
    params = SamplingParams(max_tokens=6, use_beam_search=True, beam_width=3, n=2, length_penalty=1.0)
    assert_engine_beams_match(e, reference, PROMPTS, params, eos=EOS, num_beams=3, max_new_tokens=6,
                              length_penalty=1.0, early_stopping=False, use_cache=False)


# ---- loading ---------------------------------------------------------------------------------------------

def test_state_is_float32_conv_window_in_the_model_dtype(pair):
    _, loaded = pair
    c = loaded.model.config
    state = loaded.model.new_state(3, dtype=torch.bfloat16)
    assert state["ssm"].dtype == torch.float32 and state["conv"].dtype == torch.bfloat16
    assert state.bytes_per_slot == c.n_layers * c.d_inner * ((c.d_conv - 1) * 2 + c.d_state * 4)


def test_bfloat16_load_stays_close(pair, tmp_path):
    reference, _ = pair
    save_tiny(tmp_path, model_type=reference.config.model_type)  # the same seed: the same weights
    low = load_checkpoint(tmp_path, device="cpu", dtype="bfloat16").model
    batch = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(batch).logits
    torch.testing.assert_close(low(batch), expected, atol=0.1, rtol=0)


# The released config.json files of state-spaces/mamba-130m-hf and tiiuae/falcon-mamba-7b (as on the hub).
MAMBA_130M = {
    "architectures": ["MambaForCausalLM"], "bos_token_id": 0, "conv_kernel": 4, "d_inner": 1536, "d_model": 768,
    "eos_token_id": 0, "expand": 2, "fused_add_norm": True, "hidden_act": "silu", "hidden_size": 768,
    "initializer_range": 0.1, "intermediate_size": 1536, "layer_norm_epsilon": 1e-05, "model_type": "mamba",
    "n_layer": 24, "num_hidden_layers": 24, "pad_token_id": 0, "pad_vocab_size_multiple": 8,
    "rescale_prenorm_residual": False, "residual_in_fp32": True, "rms_norm": True, "ssm_cfg": {}, "state_size": 16,
    "time_step_floor": 0.0001, "time_step_init_scheme": "random", "time_step_max": 0.1, "time_step_min": 0.001,
    "time_step_rank": 48, "time_step_scale": 1.0, "torch_dtype": "float32", "use_bias": False, "use_cache": True,
    "use_conv_bias": True, "vocab_size": 50280,
}
FALCON_MAMBA_7B = {
    "architectures": ["FalconMambaForCausalLM"], "bos_token_id": 0, "conv_kernel": 4, "eos_token_id": 11,
    "expand": 16, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.1, "intermediate_size": 8192,
    "layer_norm_epsilon": 1e-05, "model_type": "falcon_mamba", "num_hidden_layers": 64, "pad_token_id": 11,
    "rescale_prenorm_residual": False, "residual_in_fp32": True, "state_size": 16, "tie_word_embeddings": False,
    "time_step_floor": 0.0001, "time_step_init_scheme": "random", "time_step_max": 0.1, "time_step_min": 0.001,
    "time_step_rank": 256, "time_step_scale": 1.0, "torch_dtype": "bfloat16", "use_bias": False, "use_cache": True,
    "use_conv_bias": True, "vocab_size": 65024,
}


def test_released_configs_and_state_sizes():
    """mamba-130m: the module docstring's 2,801,664 bytes per sequence (2,580,480 with a bf16 window);
    falcon-mamba-7b: intermediate_size wins over its expand 16, as in transformers."""
    config, eos = config_from_hf(MAMBA_130M)
    assert (config.d_inner, config.dt_rank, config.tie_embeddings, config.bcdt_norm) == (1536, 48, True, False)
    assert eos == [0]
    with torch.device("meta"):
        model = MambaLanguageModel(config)
    assert model.backbone.layers[0].mixer.x_proj.weight.shape == (48 + 2 * 16, 1536)
    assert model.new_state(1, dtype=torch.float32).bytes_per_slot == 2_801_664
    assert model.new_state(1, dtype=torch.bfloat16).bytes_per_slot == 2_580_480
    config, eos = config_from_hf(FALCON_MAMBA_7B)
    assert (config.d_inner, config.dt_rank, config.tie_embeddings, config.bcdt_norm) == (8192, 256, False, True)
    assert eos == [11]
    assert transformers.FalconMambaConfig(**FALCON_MAMBA_7B).intermediate_size == config.d_inner


@pytest.mark.parametrize("change, option", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rms_norm": False}, "rms_norm"),
])
def test_unimplemented_option_is_refused(tmp_path, change, option):
    save_tiny(tmp_path)
    assert_load_refused(tmp_path, option, **change)


def test_untied_head_and_biases_load(tmp_path):
    reference = save_tiny(tmp_path, model_type="falcon_mamba", tie_word_embeddings=False, use_bias=True,
                          use_conv_bias=False, residual_in_fp32=False, time_step_rank=3)
    model = load_checkpoint(tmp_path, device="cpu", dtype="float32").model
    assert model.lm_head is not None and model.config.dt_rank == 3
    batch = torch.randint(0, V, (2, 25), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = reference(batch).logits
    torch.testing.assert_close(model(batch), expected, atol=ATOL, rtol=0)
