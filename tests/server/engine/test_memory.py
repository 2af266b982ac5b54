"""K,V cache sizing: the --gpu-memory-utilization arithmetic on fake figures, the profiling step on the CPU,
the CUDA readings through stand-ins for torch.cuda (and for real where there is a GPU)."""

from __future__ import annotations

import pytest
import torch

from quill.server.engine.cache import memory
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.cache.memory import DEFAULT_CACHE_BYTES, GpuMemory, choose_cache_bytes, kv_cache_bytes, profile_step
from quill.server.engine.scheduler import SchedulerConfig
from tests.conftest import build_tiny_model
from tests.server.engine.test_engine import loaded_model

GiB = 2**30


def test_the_cache_takes_what_the_fraction_leaves():
    h100 = GpuMemory(total=80 * GiB, weights=16 * GiB, peak_activations=2 * GiB, non_torch=GiB // 2)
    assert kv_cache_bytes(h100, 0.9) == int(80 * GiB * 0.9) - 16 * GiB - 2 * GiB - GiB // 2
    assert kv_cache_bytes(h100, 0.5) == 40 * GiB - 18 * GiB - GiB // 2
    assert kv_cache_bytes(h100, 1.0) - kv_cache_bytes(h100, 0.9) == 8 * GiB


def test_nothing_left_says_which_flags_help():
    small = GpuMemory(total=24 * GiB, weights=16 * GiB, peak_activations=4 * GiB, non_torch=GiB)
    assert kv_cache_bytes(small, 0.95) > 0
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization, lower --max-num-batched-tokens"):
        kv_cache_bytes(small, 0.8)  # 19.2 GiB allowed, 21 GiB taken


def test_given_bytes_win_and_the_cpu_keeps_its_default():
    _, model = build_tiny_model("transformer-llama", 300, device="cpu")
    assert choose_cache_bytes(model, 12345, 0.9, 16, 2048, 256) == 12345
    assert choose_cache_bytes(model, None, 0.9, 16, 2048, 256) == DEFAULT_CACHE_BYTES


def test_utilization_outside_zero_to_one_is_refused():
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            CacheConfig(gpu_memory_utilization=bad)


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_profiling_step_covers_the_budget_within_the_context(key):
    _, model = build_tiny_model(key, 300, device="cpu")  # GPT-2's learned positions end at 64
    budget, block_size = 150, 16
    state = model.new_state(memory.profile_blocks(budget, model.config.max_seq_len, block_size), block_size=block_size)
    scores = profile_step(model, state, budget, model.config.max_seq_len)
    assert scores.shape == (budget, 300) and torch.isfinite(scores).all()


class FakeCuda:
    """Stand-ins for the torch.cuda readings measure_gpu_memory takes, with an H100's total."""

    def __init__(self, monkeypatch, held: int, peak: int, free: int, reserved: int):
        self.total = 80 * GiB
        for name, value in [("synchronize", None), ("reset_peak_memory_stats", None), ("empty_cache", None),
                            ("memory_allocated", held), ("max_memory_allocated", peak),
                            ("mem_get_info", (free, self.total)), ("memory_reserved", reserved)]:
            monkeypatch.setattr(torch.cuda, name, lambda *args, value=value: value)


def test_readings_become_the_figures(monkeypatch):
    _, model = build_tiny_model("transformer-llama", 300, device="cpu")
    FakeCuda(monkeypatch, held=10 * GiB, peak=13 * GiB, free=60 * GiB, reserved=19 * GiB)
    figures = memory.measure_gpu_memory(model, 16, 64, model.config.max_seq_len)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert figures == GpuMemory(total=80 * GiB, weights=weights, peak_activations=3 * GiB, non_torch=GiB)


def test_the_sampler_is_profiled_at_its_costliest_and_counts_when_it_needs_more(monkeypatch):
    _, model = build_tiny_model("transformer-llama", 300, device="cpu")
    FakeCuda(monkeypatch, held=10 * GiB, peak=0, free=60 * GiB, reserved=19 * GiB)
    peaks = iter([13 * GiB, 15 * GiB, 13 * GiB])  # the prefill step's, the sampler's (256 rows' copies); again
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args: next(peaks))
    sampled = []
    monkeypatch.setattr(memory, "profile_sampler", lambda *args: sampled.append(args))
    figures = memory.measure_gpu_memory(model, 16, 64, model.config.max_seq_len, max_num_seqs=256)
    assert figures.peak_activations == 5 * GiB and sampled == [(256, 300, torch.device("cpu"))]
    memory.measure_gpu_memory(model, 16, 64, model.config.max_seq_len)  # no rows given: no sampler profiled
    assert len(sampled) == 1


def test_the_costliest_sampling_runs_every_processor():
    from quill.server.sampling.table import build_batch

    batch = build_batch([memory.COSTLIEST_SAMPLING] * 3, [[0]] * 3, [[0]] * 3, [None] * 3, 300, "cpu")
    assert batch.uses_top_p and batch.uses_min_p and batch.max_top_k == 50 and batch.num_top_logprobs == 20
    assert batch.seen_tokens is not None and batch.output_counts is not None and not batch.all_greedy
    memory.profile_sampler(3, 300, torch.device("cpu"))


def test_engine_on_a_fake_gpu_sizes_its_cache_from_the_fraction(monkeypatch, tiny_tokenizer):
    loaded = loaded_model("transformer-llama", tiny_tokenizer)
    FakeCuda(monkeypatch, held=0, peak=GiB, free=79 * GiB, reserved=0)
    monkeypatch.setattr(memory, "_device", lambda model: torch.device("cuda"))
    # eager: on a real GPU the engine would capture graphs, whose memory the fake readings cannot see
    engine = EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_batched_tokens=64),
                                             CacheConfig(block_size=16, gpu_memory_utilization=0.05),
                                             enforce_eager=True))
    expected = int(80 * GiB * 0.05) - loaded.num_parameters * 4 - GiB - GiB  # weights, activations, CUDA context
    per_block = engine.state.bytes_per_block
    assert engine.state.num_blocks == expected // per_block


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_gpu_readings_are_plausible():
    _, model = build_tiny_model("transformer-llama", 300, device="cuda")
    figures = memory.measure_gpu_memory(model, 16, 256, model.config.max_seq_len)
    assert figures.total > 0 and 0 < figures.peak_activations < figures.total
    assert kv_cache_bytes(figures, 0.9) < 0.9 * figures.total


def test_cuda_graphs_are_reserved_before_the_cache():
    h100 = GpuMemory(total=80 * GiB, weights=16 * GiB, peak_activations=2 * GiB, non_torch=GiB // 2, graphs=GiB)
    assert kv_cache_bytes(h100, 0.9) == int(80 * GiB * 0.9) - 16 * GiB - 2 * GiB - GiB // 2 - GiB
    crowded = GpuMemory(total=24 * GiB, weights=16 * GiB, peak_activations=2 * GiB, non_torch=GiB, graphs=3 * GiB)
    with pytest.raises(ValueError, match="CUDA graphs .* --enforce-eager"):
        kv_cache_bytes(crowded, 0.9)


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_the_graph_profiling_step_is_a_decode_at_full_table_width(key):
    _, model = build_tiny_model(key, 300, device="cpu")
    state = model.new_state(1, block_size=16)
    logits = memory.profile_decode_step(model, state, 24, model.config.max_seq_len)
    assert logits.shape == (24, 300) and torch.isfinite(logits).all()


def test_graph_memory_is_measured_only_when_graphs_are_captured(monkeypatch):
    _, model = build_tiny_model("transformer-llama", 300, device="cpu")
    FakeCuda(monkeypatch, held=10 * GiB, peak=13 * GiB, free=60 * GiB, reserved=19 * GiB)
    decode_steps = []
    monkeypatch.setattr(memory, "profile_decode_step", lambda *args: decode_steps.append(args[2]))
    eager = memory.measure_gpu_memory(model, 16, 64, model.config.max_seq_len)
    graphs = memory.measure_gpu_memory(model, 16, 64, model.config.max_seq_len, graph_batch_size=48)
    assert (eager.graphs, graphs.graphs, decode_steps) == (0, 3 * GiB, [48])


def test_a_hybrid_models_profiling_steps_run_on_its_blocks_and_slots(monkeypatch, tmp_path):
    """LFM2 (conv slots beside attention K,V): both profiling steps get a state of both kinds and score every row."""
    from quill.models.loading.checkpoint import load_checkpoint
    from tests.hf_state_models.lfm2 import V, save_tiny

    save_tiny(tmp_path)
    model = load_checkpoint(tmp_path, device="cpu", dtype="float32").model
    FakeCuda(monkeypatch, held=0, peak=GiB, free=79 * GiB, reserved=0)
    steps = []
    for name in ("profile_step", "profile_decode_step"):
        real = getattr(memory, name)
        monkeypatch.setattr(memory, name, lambda *args, real=real: steps.append(real(*args)) or steps[-1])
    figures = memory.measure_gpu_memory(model, 16, 100, 64, graph_batch_size=8)
    assert figures.peak_activations == GiB and figures.graphs == GiB
    assert [tuple(s.shape) for s in steps] == [(100, V), (8, V)] and all(torch.isfinite(s).all() for s in steps)
