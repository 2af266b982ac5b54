"""A fault that leaves the device usable fails its step's requests and the engine goes on; one that loses the device
(a sticky CUDA error, injected here) stops the engine: its requests fail with the reason and it reports dead."""

from __future__ import annotations

import asyncio

import pytest
import torch

from quill.server.engine.process import core_loop
from quill.server.engine.process.async_engine import AsyncEngine
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.process.core_loop import CoreLoop
from quill.server.engine.faults import DeviceLostError, device_lost
from quill.server.engine.process.frontend import EngineDeadError
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.server.engine.test_engine import loaded_model

STICKY = "CUDA error: an illegal memory access was encountered"
CONFIG = EngineConfig(SchedulerConfig(), CacheConfig(block_size=4, num_blocks=64), async_scheduling=False)
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def faulty_core(tiny_tokenizer, monkeypatch, lost: bool) -> EngineCore:
    return make_faulty(EngineCore(loaded_model("transformer-llama", tiny_tokenizer), CONFIG), monkeypatch, lost)


def make_faulty(core: EngineCore, monkeypatch, lost: bool) -> EngineCore:
    """`core` with a second step that raises, on a device that `device_lost` then calls lost (or not)."""
    real_run, calls = core.runner.run, []

    def run(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError(STICKY)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(core.runner, "run", run)
    monkeypatch.setattr(core_loop, "device_lost", lambda device: lost)
    return core


def test_a_cpu_is_never_lost():
    assert device_lost(torch.device("cpu")) is False


def test_a_usable_device_fails_the_step_and_goes_on(tiny_tokenizer, monkeypatch):
    loop = CoreLoop(faulty_core(tiny_tokenizer, monkeypatch, lost=False))
    loop.add("a", [1, 2, 3], PARAMS)
    loop.step()
    [(request_id, out)] = loop.step()
    assert request_id == "a" and out.finished and STICKY in out.error
    loop.add("b", [1, 2, 3], PARAMS)
    while loop.core.has_work():
        outputs = loop.step()
    assert outputs[-1][1].finished and outputs[-1][1].error is None


def test_a_lost_device_stops_the_loop(tiny_tokenizer, monkeypatch):
    loop = CoreLoop(faulty_core(tiny_tokenizer, monkeypatch, lost=True))
    loop.add("a", [1, 2, 3], PARAMS)
    loop.step()
    with pytest.raises(DeviceLostError, match="can run nothing more after RuntimeError: CUDA error") as lost:
        loop.step()
    assert isinstance(lost.value.__cause__, RuntimeError)


def test_an_engine_that_lost_its_device_is_dead_and_says_why(tiny_tokenizer, monkeypatch):
    engine = AsyncEngine(loaded_model("transformer-llama", tiny_tokenizer), CONFIG)
    make_faulty(engine.core, monkeypatch, lost=True)
    engine.start()

    async def main():
        return [out async for out in engine.generate([1, 2, 3], PARAMS)]

    try:
        with pytest.raises(EngineDeadError, match="can run nothing more") as dead:
            asyncio.run(main())
        assert not engine.is_alive and "server must be restarted" in engine.dead_reason
        with pytest.raises(EngineDeadError):
            asyncio.run(main())
    finally:
        engine.shutdown()
    assert "DeviceLostError" in str(dead.value)
