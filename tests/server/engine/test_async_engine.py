"""The engine thread behind an asyncio face: streaming, abort on leave, queue bound, faults."""

from __future__ import annotations

import asyncio
import threading

import pytest

from quill.server.engine.process.async_engine import AsyncEngine
from quill.server.engine.core import CacheConfig, EngineConfig
from quill.server.engine.scheduler import QueueFullError, SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.server.engine.test_engine import loaded_model


def make_engine(tiny_tokenizer, key="transformer-llama", threads=None, **scheduler) -> AsyncEngine:
    """Synchronous steps on every device: a fault injected into `runner.run` must meet a step (test_overlap.py
    injects them into overlapped ones)."""
    config = EngineConfig(SchedulerConfig(**scheduler), CacheConfig(block_size=4, num_blocks=256),
                          async_scheduling=False)
    engine = AsyncEngine(loaded_model(key, tiny_tokenizer), config, threads=threads)
    engine.start()
    return engine


async def collect(engine, prompt, params):
    return [out async for out in engine.generate(prompt, params)]


def test_concurrent_requests_stream_to_completion(tiny_tokenizer):
    engine = make_engine(tiny_tokenizer)

    async def main():
        params = [SamplingParams(max_tokens=5 + i, temperature=0, ignore_eos=True) for i in range(6)]
        return await asyncio.gather(*(collect(engine, [1, 2, 3 + i], p) for i, p in enumerate(params)))

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    for i, outs in enumerate(results):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert sum(len(o.outputs[0].token_ids) for o in outs) == 5 + i
    assert engine.core.cache.usage == 0


def test_leaving_early_aborts_and_frees(tiny_tokenizer):
    engine = make_engine(tiny_tokenizer)

    async def main():
        stream = engine.generate([1, 2, 3], SamplingParams(max_tokens=500, ignore_eos=True))
        async for _ in stream:
            break  # the client goes away after the first delta
        await stream.aclose()
        for _ in range(100):
            if not engine.core.has_work():
                return True
            await asyncio.sleep(0.02)
        return False

    try:
        assert asyncio.run(main())
    finally:
        engine.shutdown()
    assert engine.core.cache.usage == 0


def test_full_queue_is_refused_at_once(tiny_tokenizer):
    engine = make_engine(tiny_tokenizer, max_queue=1, max_num_seqs=1)
    paused = threading.Event()
    real_step = engine.core.step

    def held_step():  # the engine stalls until released, so the queue fills deterministically
        paused.wait(timeout=30)
        return real_step()

    engine.core.step = held_step

    async def main():
        first = asyncio.create_task(collect(engine, [1, 2], SamplingParams(max_tokens=3, ignore_eos=True)))
        while engine.num_pending < 1:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError):
            await collect(engine, [1, 2], SamplingParams(max_tokens=2))
        paused.set()
        return await first

    try:
        outs = asyncio.run(main())
    finally:
        paused.set()
        engine.shutdown()
    assert outs[-1].finished and outs[-1].error is None


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny_tokenizer, monkeypatch):
    engine = make_engine(tiny_tokenizer)
    real_forward = engine.core.runner.run
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(engine.core.runner, "run", flaky)

    async def main():
        failed = await collect(engine, [1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True))
        ok = await collect(engine, [4, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
        return failed, ok

    try:
        failed, ok = asyncio.run(main())
    finally:
        engine.shutdown()
    assert failed[-1].error and "injected fault" in failed[-1].error
    assert failed[-1].outputs[0].finish_reason == "error"
    assert ok[-1].error is None and ok[-1].finished
    assert engine.core.cache.usage == 0 and engine.is_alive is False  # shut down now


def test_steps_run_with_the_thread_count_asked_for(tiny_tokenizer):
    import torch

    own = torch.get_num_threads()
    seen = []
    engine = make_engine(tiny_tokenizer, threads=1)
    engine.on_stats = lambda stats: seen.append(torch.get_num_threads())
    try:
        asyncio.run(collect(engine, [3, 4, 5], SamplingParams(max_tokens=3, temperature=0.0)))
    finally:
        engine.shutdown()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == own  # the count is the engine thread's own: the caller's is unchanged


def test_auto_fits_the_cores_this_process_may_use(monkeypatch):
    import torch

    from quill.server.engine import cpu_threads

    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 3)
    assert cpu_threads.step_threads(torch.device("cpu"), None) is None  # torch's own count
    fixed = cpu_threads.step_threads(torch.device("cpu"), 1)
    assert (fixed.wanted, fixed.load) == (1, None)
    auto = cpu_threads.step_threads(torch.device("cpu"), "auto")
    assert auto.wanted == 3 and auto.load is not None
    assert cpu_threads.step_threads(torch.device("cuda"), "auto") is None
