"""Arrivals far beyond capacity, and an engine that dies: refusals are fast, admitted work finishes."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from benchmarks.soak import metric_values, rss_mib, wait_idle
from server.api.app import create_app
from server.hosting import ModelHost
from tests.conftest import LiveServer
from tests.server.api.conftest import server_config


def test_overload_is_refused_fast_and_admitted_requests_finish(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints, "--max-num-seqs", "4", "--max-queue", "8")
    server.wait_ready()
    rss_before = rss_mib(server.process.pid)

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=200)) as c:
            async def one(i):
                start = time.monotonic()
                r = await c.post("/v1/completions", json={"model": "tiny-lstm", "prompt": f"To be {i}",
                                                          "max_tokens": 200, "ignore_eos": True})
                return r.status_code, time.monotonic() - start, r.headers.get("Retry-After")

            async def probe():  # while the queue is full: how long one excess request takes to be refused
                deadline = time.monotonic() + 10  # a slow machine may take a while to receive the whole burst
                while time.monotonic() < deadline:
                    waiting = metric_values((await c.get("/metrics")).text, "quill_num_requests_waiting")
                    if waiting.get("tiny-lstm", 0) >= 8:
                        break
                    await asyncio.sleep(0.005)
                times = []
                for _ in range(15):
                    start = time.monotonic()
                    r = await c.post("/v1/completions", json={"model": "tiny-lstm", "prompt": "x", "max_tokens": 2})
                    if r.status_code == 429:
                        times.append(time.monotonic() - start)
                return times

            results, probes = [], []
            for wave in range(3):  # three bursts of 60: about five times what the queue and batch hold
                burst = asyncio.gather(*(one(wave * 100 + i) for i in range(60)))
                results_wave, probe_times = await asyncio.gather(burst, probe())
                results += results_wave
                probes += probe_times
            return results, probes, await wait_idle(c)

    try:
        results, probes, leftover = asyncio.run(main())
        rss_after = rss_mib(server.process.pid)
    finally:
        server.stop()
    refused = [(t, ra) for s, t, ra in results if s == 429]
    admitted = [t for s, t, _ in results if s == 200]
    assert {s for s, _, _ in results} <= {200, 429}
    assert len(refused) > 60 and len(admitted) >= 12
    assert all(ra == "1" for _, ra in refused)
    probe_median = statistics.median(probes)
    print(f"{len(refused)} of {len(results)} refused; "
          f"median latency: refusal of a request while the queue is full {probe_median * 1000:.1f} ms, "
          f"refusals inside a burst of 60 {statistics.median(t for t, _ in refused) * 1000:.0f} ms, "
          f"admitted requests {statistics.median(admitted) * 1000:.0f} ms")
    assert len(probes) >= 5 and probe_median < 0.05  # an excess request is refused in milliseconds
    assert max(admitted) < 30  # admitted requests finish in bounded time
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
