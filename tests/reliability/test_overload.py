"""Arrivals far beyond capacity, and an engine that dies: refusals are fast, admitted work finishes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import time

import httpx

from benchmarks.soak import rss_mib, wait_idle
from quill.server.api.app import create_app
from quill.server.hosting import ModelHost
from tests.conftest import LiveServer
from tests.server.api.conftest import server_config


def test_overload_is_refused_fast_and_admitted_requests_finish(tiny_checkpoints):
    """Bursts of 60 against a queue of 8, each sent while the engine process is held (SIGSTOP): exactly a queue's
    worth is admitted, every other request is refused with 429 without waiting for the engine, and what was admitted
    finishes once the engine goes on. Held, the engine cannot drain the queue while a burst arrives, so the counts
    do not depend on how fast the machine steps (a running engine's, racing the burst, did)."""
    lstm = {"tiny-lstm": tiny_checkpoints["tiny-lstm"]}
    server = LiveServer(lstm, "--engine-process", "--max-num-seqs", "4", "--max-queue", "8")
    server.wait_ready()
    engine_pid = int(re.search(r"engine process started \(pid (\d+)\)", server.output()).group(1))
    rss_before = rss_mib(server.process.pid)
    queue, burst_size = 8, 60

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=200)) as c:
            async def one(i):
                start = time.monotonic()
                r = await c.post("/v1/completions", json={"model": "tiny-lstm", "prompt": f"To be {i}",
                                                          "max_tokens": 200, "ignore_eos": True})
                return r.status_code, time.monotonic() - start, r.headers.get("Retry-After")

            async def answered(tasks, count):
                while sum(t.done() for t in tasks) < count:
                    await asyncio.wait([t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED)

            async def probe():  # while the queue is full: how long one excess request takes to be refused
                outcomes = []
                for _ in range(15):
                    start = time.monotonic()
                    r = await c.post("/v1/completions", json={"model": "tiny-lstm", "prompt": "x", "max_tokens": 2})
                    outcomes.append((r.status_code, time.monotonic() - start))
                return outcomes

            waves, probes = [], []
            for wave in range(3):
                os.kill(engine_pid, signal.SIGSTOP)
                try:
                    burst = [asyncio.ensure_future(one(wave * 100 + i)) for i in range(burst_size)]
                    # The held engine takes nothing from the queue, so all but a queue's worth are refused now
                    # (the bound only keeps a failure from hanging); the probes then find the queue full.
                    await asyncio.wait_for(answered(burst, burst_size - queue), 60)
                    probes += await probe()
                finally:
                    os.kill(engine_pid, signal.SIGCONT)
                waves.append(await asyncio.gather(*burst))
            return waves, probes, await wait_idle(c)

    try:
        waves, probes, leftover = asyncio.run(main())
        rss_after = rss_mib(server.process.pid)
    finally:
        server.stop()
    results = [r for wave in waves for r in wave]
    refused = [(t, ra) for s, t, ra in results if s == 429]
    admitted = [t for s, t, _ in results if s == 200]
    assert [sorted(s for s, _, _ in wave) for wave in waves] == [[200] * queue + [429] * (burst_size - queue)] * 3
    assert all(ra == "1" for _, ra in refused)
    assert [s for s, _ in probes] == [429] * 45  # refused without the engine's help: it is held
    probe_median = statistics.median(t for _, t in probes)
    print(f"{len(refused)} of {len(results)} refused; "
          f"median latency: refusal of a request while the queue is full {probe_median * 1000:.1f} ms, "
          f"refusals inside a burst of {burst_size} {statistics.median(t for t, _ in refused) * 1000:.0f} ms, "
          f"admitted requests {statistics.median(admitted) * 1000:.0f} ms")
    assert probe_median < 0.05  # an excess request is refused in milliseconds (about 2 ms on a 2-core CPU)
    assert max(admitted) < 30  # admitted requests finish in bounded time (a bound on a hang, not a race)
    assert all(v == 0 for v in leftover.values())
    assert rss_after < rss_before + 200


class EngineCrash(BaseException):
    """Not an Exception: it escapes the per-step guard and kills the loop, as a real bug might."""


async def test_ready_reports_a_dead_engine(tiny_checkpoints):
    config = server_config(tiny_checkpoints)
    host = ModelHost.load(config)
    engine = host.get("tiny-gcnn").engine

    def crash():
        raise EngineCrash("simulated")

    engine.core.step = crash
    host.start()
    app = create_app(host, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30) as c:
            r = await c.post("/v1/completions", json={"model": "tiny-gcnn", "prompt": "x", "max_tokens": 2})
            assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
            ready = await c.get("/ready")
            assert ready.status_code == 503 and ready.json()["models"] == ["tiny-gcnn"]
            r = await c.post("/v1/completions", json={"model": "tiny-lstm", "prompt": "x", "max_tokens": 2})
            assert r.status_code == 200  # the other models keep serving
    finally:
        host.shutdown()
