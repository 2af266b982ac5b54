"""An engine over a model split 2 ways (rank 0 here, rank 1 a process of its own, over gloo) answers as the engine
over the whole model: the same greedy, beam and seeded tokens in a busy batch, logits within 1e-5, the other rank's
cache following rank 0's block copies; K,V heads replicated where there are fewer than ranks. A model that cannot
be split is refused before any rank starts; a rank that dies makes the engine report its group lost; ranks started
apart (`quill tp-worker`, as on other machines) serve the same."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
import torch

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint
from quill.server.engine import EngineStartError, ParallelConfig, load_engine_model
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.faults import DeviceLostError
from quill.server.engine.process.async_engine import AsyncEngine
from quill.server.engine.process.frontend import EngineDeadError
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import free_port
from tests.server.engine.graph_emulation import EmulatedGraphs
from tests.parallel_checkpoints import KINDS, write_checkpoint
from tests.server.engine.helpers import run_to_completion

pytest.importorskip("transformers")

PROMPTS = [[10, 20, 30, 40, 50], [7, 8, 9], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112], [42]]
LOAD = dict(device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory):
    return tmp_path_factory.mktemp("parallel")


@pytest.fixture(scope="module", params=KINDS)
def pair(request, checkpoint_root):
    """(the whole model, the model split 2 ways), one rank process per kind for the module."""
    directory = write_checkpoint(request.param, checkpoint_root / request.param)
    split = load_engine_model(directory, ParallelConfig(2), **LOAD)
    yield load_checkpoint(directory, **LOAD), split
    split.model.close()


def engine(loaded, size: int, graph_capture=None) -> EngineCore:
    return EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=64),
                                           CacheConfig(block_size=4, num_blocks=128), parallel=ParallelConfig(size)),
                      graph_capture=graph_capture)


def busy_batch(e: EngineCore) -> dict:
    """Greedy and beam requests among seeded sampled ones (n > 1 forks: block copies), run to the end."""
    for i in range(4):
        e.add_request(f"noise{i}", PROMPTS[i] + [i + 1] * (i + 2),
                      SamplingParams(max_tokens=4 + 2 * i, temperature=0.9, top_k=20, n=1 + i % 2, seed=i))
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"greedy{i}", prompt, SamplingParams(max_tokens=8, temperature=0))
        e.add_request(f"beam{i}", prompt, SamplingParams(max_tokens=6, use_beam_search=True, beam_width=3, n=2))
    return run_to_completion(e)


def tokens(results: dict) -> dict:
    return {request: [out["token_ids"] for index, out in sorted(outputs.items()) if isinstance(index, int)]
            for request, outputs in results.items()}


def test_a_busy_batch_gets_the_same_tokens_as_on_one_device_eagerly(pair):
    whole, split = pair
    one, two = engine(whole, 1), engine(split, 2, graph_capture=EmulatedGraphs())
    assert not two.runner.graphs  # tensor-parallel steps are not captured
    assert tokens(busy_batch(two)) == tokens(busy_batch(one))
    assert two.cache.usage == 0


def test_logits_match_the_whole_model_and_the_other_rank_follows_block_copies(pair):
    whole, split = pair
    logits = []
    for model in (whole.model, split.model):
        state = model.new_state(8, block_size=4)
        first = model.step(StepBatch.build([[10, 20, 30, 40, 50], [7, 8, 9]], [0, 0], block_tables=[[0, 1], [2]],
                                           logits="all"), state)
        state.copy_blocks([1], [5])  # copy on write: the step after reads block 5 where it read block 1
        second = model.step(StepBatch.build([[11], [12]], [5, 3], block_tables=[[0, 5], [2]]), state)
        logits.append((first, second))
    for want, got in zip(*logits):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_kv_heads_are_replicated_where_there_are_fewer_than_ranks(pair):
    whole, split = pair
    shard = split.model.shard
    assert shard.config.n_heads == whole.model.config.n_heads // 2
    assert shard.config.n_kv_heads == max(1, whole.model.config.n_kv_heads // 2)
    assert split.model.new_state(2, block_size=4).k.shape[3] == shard.config.n_kv_heads


def test_a_model_that_cannot_be_split_is_refused_before_any_rank_starts(checkpoint_root, tiny_checkpoints):
    directory = write_checkpoint("llama", checkpoint_root / "refused")
    with pytest.raises(ValueError, match="cannot be split over tensor-parallel size 3: its 4 attention heads"):
        load_engine_model(directory, ParallelConfig(3), **LOAD)
    with pytest.raises(ValueError, match="decoder-only Transformer family .* not a 'lstm' model"):
        load_engine_model(tiny_checkpoints["tiny-lstm"], ParallelConfig(2), **LOAD)


def test_a_rank_that_dies_makes_the_engine_report_its_group_lost(checkpoint_root):
    directory = write_checkpoint("llama", checkpoint_root / "dies")
    split = load_engine_model(directory, ParallelConfig(2), **LOAD)
    engine = AsyncEngine(split, EngineConfig(SchedulerConfig(), CacheConfig(block_size=4, num_blocks=64),
                                             parallel=ParallelConfig(2)))
    engine.start()

    async def generate():
        return [out async for out in engine.generate([1, 2, 3], SamplingParams(max_tokens=4, temperature=0))]

    try:
        assert asyncio.run(generate())[-1].finished
        [rank] = split.model.ranks.processes
        os.kill(rank.pid, signal.SIGKILL)
        rank.wait()
        with pytest.raises(EngineDeadError, match="tensor-parallel group of 2 ranks is lost .*exited with code -9"):
            asyncio.run(generate())
        assert not engine.is_alive and "must be restarted" in engine.dead_reason
        with pytest.raises(DeviceLostError):
            split.model.step(StepBatch.build([[1]], [0], block_tables=[[0]]), split.model.new_state(1, 4))
    finally:
        engine.shutdown()
        split.model.close()


def start_apart(monkeypatch, world_size: int) -> subprocess.Popen:
    """`quill tp-worker` as rank 1, started as on another machine: rank 0 (this process) found by the environment."""
    port = free_port()
    environment = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": str(world_size)}
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    return subprocess.Popen([sys.executable, "-m", "quill.cli", "tp-worker"], env={**os.environ, **environment})


def test_a_rank_that_cannot_join_is_named_at_startup(checkpoint_root, monkeypatch):
    directory = write_checkpoint("llama", checkpoint_root / "mismatched")
    worker = start_apart(monkeypatch, world_size=3)
    try:
        with pytest.raises(EngineStartError, match="rank 1 could not load its shard: WORLD_SIZE is 3, rank 0 serves "
                                                   "tensor-parallel size 2"):
            load_engine_model(directory, ParallelConfig(2, workers="external"), **LOAD)
        assert worker.wait(timeout=30) == 2
    finally:
        if worker.poll() is None:
            worker.kill()


def test_ranks_started_apart_meet_rank_0_by_the_environment(checkpoint_root, monkeypatch):
    directory = write_checkpoint("gpt2", checkpoint_root / "apart")
    worker = start_apart(monkeypatch, world_size=2)
    try:
        split = load_engine_model(directory, ParallelConfig(2, workers="external"), **LOAD)
        assert split.model.ranks.processes == []
        e = engine(split, 2)
        e.add_request("greedy", PROMPTS[0], SamplingParams(max_tokens=6, temperature=0))
        got = tokens(run_to_completion(e))
        one = engine(load_checkpoint(directory, **LOAD), 1)
        one.add_request("greedy", PROMPTS[0], SamplingParams(max_tokens=6, temperature=0))
        assert got == tokens(run_to_completion(one))
        split.model.close()
        assert worker.wait(timeout=30) == 0  # told to stop, it exits
    finally:
        if worker.poll() is None:
            worker.kill()
