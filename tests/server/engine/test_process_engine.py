"""The engine core in a process of its own: the same outputs as on a thread, load errors told plainly,
a dead process noticed, a load stopped when the server stops; and what both engine kinds share: coalesced
streams, clear step errors."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
import torch

from quill.models.loading.checkpoint import load_checkpoint
from quill.server.engine.process.async_engine import AsyncEngine
from quill.server.engine.core import CacheConfig, EngineConfig
from quill.server.engine.process.core_process import CoreSpec
from quill.server.engine.process.frontend import EngineDeadError
from quill.server.engine.process.process_engine import EngineStartCancelled, EngineStartError, ProcessEngine
from quill.server.engine.scheduler import QueueFullError, SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import TEST_DEVICE

CONFIG = EngineConfig(SchedulerConfig(max_num_seqs=8), CacheConfig(block_size=4, num_blocks=256))


def spec(path: str, name: str = "m", config: EngineConfig = CONFIG) -> CoreSpec:
    return CoreSpec(name, path, dict(device=str(TEST_DEVICE), dtype="float32"), config)


def load(path: str):
    """In this process, as `spec` loads it in the engine's (dtype "auto" would be bf16 on a GPU)."""
    return load_checkpoint(path, device=TEST_DEVICE, dtype="float32")


async def run(engine, prompts, params):
    async def one(prompt):
        text, ids = "", []
        async for out in engine.generate(prompt, params):
            text += out.outputs[0].text
            ids += out.outputs[0].token_ids
        return text, ids
    return await asyncio.gather(*(one(p) for p in prompts))


@pytest.fixture(scope="module")
def process_engine(tiny_checkpoints):
    engine = ProcessEngine(spec(tiny_checkpoints["tiny-transformer"]))
    engine.start()
    yield engine
    engine.shutdown()


def test_same_outputs_as_the_thread_engine(process_engine, tiny_checkpoints):
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8]]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    thread_engine = AsyncEngine(load(tiny_checkpoints["tiny-transformer"]), CONFIG)
    thread_engine.start()
    try:
        expected = asyncio.run(run(thread_engine, prompts, params))
    finally:
        thread_engine.shutdown()
    assert asyncio.run(run(process_engine, prompts, params)) == expected
    assert all(len(ids) == 12 for _, ids in expected)
    assert process_engine.info.cache_bytes > 0 and process_engine.num_active == 0


def test_refusals_come_back_as_the_streams_errors(process_engine):
    async def main():
        return [out async for out in process_engine.generate([], SamplingParams(max_tokens=2))]
    with pytest.raises(ValueError, match="no tokens") as refused:
        asyncio.run(main())
    assert type(refused.value) is ValueError


def test_a_full_queue_in_the_engine_process_is_raised_as_queue_full(tiny_checkpoints, monkeypatch):
    """The core refuses what the frontend's count let through (here: a count that says nothing waits)."""
    config = EngineConfig(SchedulerConfig(max_num_seqs=1, max_queue=1), CacheConfig(block_size=4, num_blocks=64))
    engine = ProcessEngine(spec(tiny_checkpoints["tiny-lstm"], config=config))
    monkeypatch.setattr(ProcessEngine, "num_pending", property(lambda self: 0))
    engine.start()
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    sent, all_sent = [], threading.Event()
    real_send = engine._send_or_fail

    def send(messages):  # on the sender thread: the three adds are in the pipe once this has run for them
        written = real_send(messages)
        sent.extend(messages)
        if len(sent) >= 3:
            all_sent.set()
        return written

    monkeypatch.setattr(engine, "_send_or_fail", send)

    async def outcome(stream):
        try:
            return [out async for out in stream][-1].finished
        except Exception as e:
            return e

    async def main():
        os.kill(engine.pid, signal.SIGSTOP)  # all three arrive together, before a step admits the first
        try:
            streams = [engine.submit([1, 2], params) for _ in range(3)]
            assert all_sent.wait(30)  # the held core then reads all three before its next step
        finally:
            os.kill(engine.pid, signal.SIGCONT)
        return [await outcome(s) for s in streams]

    try:
        outcomes = asyncio.run(main())
    finally:
        engine.shutdown()
    assert outcomes[0] is True
    assert [type(e) for e in outcomes[1:]] == [QueueFullError, QueueFullError]
    assert str(outcomes[1]) == "the queue is full (1 requests waiting)"


def test_a_request_that_cannot_be_encoded_fails_the_engine_rather_than_hanging(tiny_checkpoints):
    engine = ProcessEngine(spec(tiny_checkpoints["tiny-lstm"]))
    engine.start()

    async def main():
        stream = engine.submit([1, object()], SamplingParams(max_tokens=2))  # msgpack knows no such token
        with pytest.raises(EngineDeadError, match="engine process unreachable: TypeError"):
            await asyncio.wait_for(stream.final(), 10)

    try:
        asyncio.run(main())
        assert not engine.is_alive
    finally:
        engine.shutdown()


def test_a_load_error_is_told_plainly(tmp_path):
    engine = ProcessEngine(spec(str(tmp_path / "missing")))
    with pytest.raises(EngineStartError, match="no such checkpoint directory"):
        engine.start()
    assert not engine.is_alive


def test_a_stop_ends_an_engine_process_that_is_still_loading(tiny_checkpoints, monkeypatch):
    """The server stopping while an engine process loads (it ignores SIGTERM) ends it at once; one asked to
    start after the stop never starts."""
    stop, rescued = threading.Event(), threading.Event()
    engine = ProcessEngine(spec(tiny_checkpoints["tiny-lstm"]))
    real_first_message = engine._first_message

    def rescue():  # a start() that waited for the load would wait for ever: let the load go on, and fail
        rescued.set()
        os.kill(engine.pid, signal.SIGCONT)

    rescue_timer = threading.Timer(30, rescue)

    def stopped_while_loading(stop_event):
        # Just spawned, long before it can have loaded, the process is held (SIGSTOP): its load cannot finish.
        os.kill(engine.pid, signal.SIGSTOP)
        rescue_timer.start()
        stop.set()
        return real_first_message(stop_event)

    monkeypatch.setattr(engine, "_first_message", stopped_while_loading)
    try:
        with pytest.raises(EngineStartCancelled, match="began to stop while its engine process loaded"):
            engine.start(stop)
    finally:
        rescue_timer.cancel()
    assert not rescued.is_set()
    assert engine.pid is not None and not engine._process.is_alive() and not engine.is_alive
    later = ProcessEngine(spec(tiny_checkpoints["tiny-lstm"]))
    with pytest.raises(EngineStartCancelled, match="before its engine process started"):
        later.start(stop)
    assert later.pid is None


def test_a_dead_engine_process_fails_open_streams_and_new_requests(tiny_checkpoints):
    engine = ProcessEngine(spec(tiny_checkpoints["tiny-lstm"]))
    engine.start()

    async def main():
        stream = engine.submit([1, 2, 3], SamplingParams(max_tokens=5000, ignore_eos=True))
        await stream.__anext__()
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="exit code -9"):
            async for _ in stream:
                pass

    try:
        asyncio.run(main())
        assert not engine.is_alive
        with pytest.raises(EngineDeadError, match="exited unexpectedly"):
            engine.submit([1], SamplingParams(max_tokens=1))
    finally:
        engine.shutdown()


def read_after_the_engine_finishes(tiny_checkpoints, params: SamplingParams) -> list:
    """One request's outputs: read once after the engine's first step, then only after the engine has finished
    it. The engine is held (in its stats hook, which runs after a step's outputs were handed to the event loop)
    until the first read is done, and the event loop reads nothing more until the engine is idle: what is read
    depends on that order alone, not on how fast the engine runs."""
    engine = AsyncEngine(load(tiny_checkpoints["tiny-lstm"]), CONFIG)
    first_read, finished = threading.Event(), threading.Event()

    def after_step(stats):  # on the engine thread
        if stats.step_num_seqs:
            first_read.wait(30)  # held until the first read (30 s: a bound for a failing test only)
        elif first_read.is_set() and stats.num_running == stats.num_waiting == 0:
            finished.set()  # the idle report after the last step: every output has been handed over

    engine.on_stats = after_step
    engine.start()

    async def main():
        stream = engine.submit([1, 2, 3], params)
        outs = [await stream.__anext__()]
        first_read.set()
        # Blocks this event loop, so the engine's outputs queue up behind it unread; a bound, not a guess.
        assert finished.wait(30)
        outs += [out async for out in stream]
        return outs

    try:
        return asyncio.run(main())
    finally:
        engine.shutdown()


def test_waiting_outputs_are_read_as_one(tiny_checkpoints):
    """A reader that falls behind gets one output covering every step it missed."""
    outs = read_after_the_engine_finishes(tiny_checkpoints, SamplingParams(max_tokens=20, temperature=0,
                                                                           ignore_eos=True))
    assert len(outs) == 2 and outs[-1].finished
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 20


def test_out_of_memory_in_a_step_fails_its_requests_clearly(tiny_checkpoints, monkeypatch):
    engine = AsyncEngine(load(tiny_checkpoints["tiny-lstm"]), CONFIG)

    def out_of_memory(batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    real_run = engine.core.runner.run
    monkeypatch.setattr(engine.core.runner, "run", out_of_memory)
    engine.start()

    async def main():
        failed = [out async for out in engine.generate([1, 2], SamplingParams(max_tokens=3))]
        monkeypatch.setattr(engine.core.runner, "run", real_run)
        ok = [out async for out in engine.generate([1, 2], SamplingParams(max_tokens=3, ignore_eos=True))]
        return failed, ok

    try:
        failed, ok = asyncio.run(main())
    finally:
        engine.shutdown()
    assert failed[-1].error.startswith("out of GPU memory while generating (CUDA out of memory")
    assert ok[-1].error is None and sum(len(o.outputs[0].token_ids) for o in ok) == 3


def test_a_slow_reader_of_logprobs_gets_joined_outputs_with_every_logprob(tiny_checkpoints):
    """Outputs that waited are joined for requests with log-probabilities too, each token's entry kept."""
    outs = read_after_the_engine_finishes(tiny_checkpoints, SamplingParams(max_tokens=6, temperature=0,
                                                                           ignore_eos=True, logprobs=1))
    assert len(outs) == 2 and sum(len(o.outputs[0].token_ids) for o in outs) == 6
    assert all(len(o.outputs[0].logprobs) == len(o.outputs[0].token_ids) for o in outs)
    assert all(len(e.top) == 1 for o in outs for e in o.outputs[0].logprobs)


def test_submitting_never_waits_for_a_busy_engine_process(tiny_checkpoints):
    """A burst of requests overfills the pipe while the core cannot read it (stopped here, as if in a long
    step): submitting still returns at once, and every request is served once the core goes on."""
    engine = ProcessEngine(spec(tiny_checkpoints["tiny-lstm"]))
    engine.start()
    # What fills the pipe is bytes: a long stop string makes each request ~10 KiB without a long prefill.
    params = SamplingParams(max_tokens=2, ignore_eos=True, stop=["never seen " * 1000])
    rescued = threading.Event()

    def rescue():  # a submit that waited for the held engine would wait for ever: let it go on, and fail
        rescued.set()
        os.kill(engine.pid, signal.SIGCONT)

    async def main():
        os.kill(engine.pid, signal.SIGSTOP)
        resume = threading.Timer(5.0, rescue)
        resume.start()
        streams = [engine.submit([1, 2, 3], params) for _ in range(100)]  # ~15 times what a pipe buffers
        resume.cancel()
        os.kill(engine.pid, signal.SIGCONT)
        return [[out async for out in stream] for stream in streams]

    try:
        outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert not rescued.is_set()  # every submit returned while the engine was still held
    assert all(o[-1].finished and o[-1].error is None for o in outs)
    assert sum(len(out.outputs[0].token_ids) for o in outs for out in o) == 200
