"""Soak test: many mixed requests against a running server, a fifth of the clients walking away.

    .venv/bin/python -m benchmarks.soak --spawn                      # start `quill serve` with the bundled models
    .venv/bin/python -m benchmarks.soak --url http://127.0.0.1:8000 --server-pid PID

Mixes models, greedy/sampling/beam/n>1, streaming and not; `--disconnect` of the clients leave
at a random point (mid-stream, or while waiting). Passes when there is no 5xx, every completed
response is well formed, and afterwards the server holds no request and no cache (from /metrics),
with its resident memory reported before and after. Loopback only; bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

import httpx

from quill.clients.ready import wait_until_ready

PROMPTS = ["ROMEO:", "To be, or not to be", "KING HENRY:\nOnce more unto the breach", "O Romeo, Romeo!",
           "Friends, Romans, countrymen", "Now is the winter of our discontent", "All the world's a stage"]
STRATEGIES = {
    "greedy": dict(temperature=0),
    "top_p": dict(temperature=0.9, top_p=0.9),
    "top_k": dict(temperature=1.0, top_k=20, seed=7),
    "beam": dict(use_beam_search=True, best_of=3, n=2),
    "n2": dict(n=2, temperature=0.8),
}


@dataclass
class SoakResult:
    requests: int = 0
    completed: int = 0
    leavers: int = 0  # clients that meant to leave early (those whose answer came first completed instead)
    disconnected: int = 0  # clients that did leave before their answer ended
    sure_leavers: int = 0  # streamed ones leaving after the first event, which every stream has before its end
    malformed: int = 0
    statuses: dict = field(default_factory=dict)
    server_5xx: int = 0
    seconds: float = 0.0
    rss_before_mib: float | None = None
    rss_after_mib: float | None = None
    leftover: dict = field(default_factory=dict)  # running / waiting / cache usage per model after the run

    @property
    def passed(self) -> bool:
        idle = all(v == 0 for v in self.leftover.values())
        return self.server_5xx == 0 and self.malformed == 0 and idle


def check_completion(body: dict, n: int) -> bool:
    choices = body.get("choices", [])
    return (len(choices) == n and all(c.get("finish_reason") in ("stop", "length") for c in choices)
            and isinstance(body.get("usage", {}).get("completion_tokens"), int))


def check_stream(events: list, n: int) -> bool:
    if not events or events[-1] != "[DONE]":
        return False
    finished = {c["index"] for e in events[:-1] for c in e.get("choices", []) if c.get("finish_reason")}
    return finished == set(range(n)) and not any("error" in e for e in events[:-1])


async def one_request(client: httpx.AsyncClient, rng: random.Random, models: list[str], disconnect_fraction: float,
                      result: SoakResult) -> None:
    strategy = rng.choice(list(STRATEGIES))
    body = dict(model=rng.choice(models), prompt=rng.choice(PROMPTS), max_tokens=rng.randint(4, 48),
                stream=strategy != "beam" and rng.random() < 0.5, **STRATEGIES[strategy])
    n = body.get("n", 1)
    leave = rng.random() < disconnect_fraction
    result.requests += 1
    result.leavers += leave
    try:
        if body["stream"]:
            events = []
            async with client.stream("POST", "/v1/completions", json=body) as r:
                result.statuses[r.status_code] = result.statuses.get(r.status_code, 0) + 1
                if r.status_code != 200:
                    await r.aread()
                    return
                stop_after = rng.randint(1, 6) if leave else None
                result.sure_leavers += stop_after == 1
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        data = line[6:]
                        events.append(data if data == "[DONE]" else json.loads(data))
                        if stop_after is not None and len(events) >= stop_after:
                            result.disconnected += 1
                            return  # leaving the block closes the connection mid-stream
            result.completed += 1
            result.malformed += not check_stream(events, n)
        else:
            request = client.post("/v1/completions", json=body)
            if leave:  # give up while queued or generating
                try:
                    r = await asyncio.wait_for(request, timeout=rng.uniform(0.01, 0.3))
                except asyncio.TimeoutError:
                    result.disconnected += 1
                    return
            else:
                r = await request
            result.statuses[r.status_code] = result.statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                result.completed += 1
                result.malformed += not check_completion(r.json(), n)
    except httpx.HTTPError:
        result.statuses["transport_error"] = result.statuses.get("transport_error", 0) + 1


def metric_values(text: str, name: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf'^{name}{{model="([^"]+)"}} (\S+)$', text, re.M)}


async def wait_idle(client: httpx.AsyncClient, timeout: float = 15.0) -> dict:
    """Poll /metrics until every model holds no request and no cache (or time runs out); the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        text = (await client.get("/metrics")).text
        leftover = {}
        for name in ("quill_num_requests_running", "quill_num_requests_waiting", "quill_cache_usage_ratio"):
            for model, value in metric_values(text, name).items():
                leftover[f"{name}{{{model}}}"] = value
        if all(v == 0 for v in leftover.values()) or time.monotonic() > deadline:
            return leftover
        await asyncio.sleep(0.2)


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


async def soak(url: str, num_requests: int, concurrency: int, disconnect_fraction: float, seed: int,
               max_seconds: float, server_pid: int | None = None) -> SoakResult:
    if urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError("the soak test only targets a server on this machine (loopback)")
    result = SoakResult(rss_before_mib=rss_mib(server_pid))
    rng = random.Random(seed)
    start = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        models = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        queue = asyncio.Queue()
        for _ in range(num_requests):
            queue.put_nowait(random.Random(rng.random()))

        async def worker():
            while not queue.empty() and time.monotonic() - start < max_seconds:
                await one_request(client, queue.get_nowait(), models, disconnect_fraction, result)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = round(time.monotonic() - start, 2)
        result.leftover = await wait_idle(client)
    result.server_5xx = sum(v for k, v in result.statuses.items() if isinstance(k, int) and k >= 500)
    result.rss_after_mib = rss_mib(server_pid)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--spawn", action="store_true", help="start `quill serve` (bundled models) on --url's port first")
    p.add_argument("--server-pid", type=int, default=None, help="report this process's resident memory")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--disconnect", type=float, default=0.2, help="fraction of clients that leave early")
    p.add_argument("--max-seconds", type=float, default=1800, help="stop sending new requests after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    server = None
    if args.spawn:
        port = str(urlparse(args.url).port or 8000)
        server = subprocess.Popen([sys.executable, "-m", "quill.cli", "serve", "--port", port],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        args.server_pid = server.pid
        wait_until_ready(args.url, timeout=300, interval=0.2, still_starting=lambda: server.poll() is None)
    try:
        result = asyncio.run(soak(args.url, args.requests, args.concurrency, args.disconnect, args.seed,
                                  args.max_seconds, args.server_pid))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    report = asdict(result) | {"passed": result.passed}
    print(json.dumps(report, indent=2, default=str))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
