"""Two real replicas behind Debian's nginx running the project's own nginx template, on loopback ports.

40 requests in all, a few at a time: 16 mixed streaming and non-streaming ones on two healthy replicas
(each replica's /metrics counts exactly what nginx sent it), then 4 long streams spread over both, one
replica SIGKILLed, and 20 more requests. Every non-streaming request still succeeds (nginx resends it to
the survivor: `non_idempotent` retries, see the template); a stream on the dead replica ends with an error
or an EOF within seconds, never hangs; streams on the survivor keep flowing."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LiveServer, free_port
from tests.deploy.conftest import require_tool
from tests.deploy.nginx_proxy import Nginx

MODELS = ("tiny-lstm", "tiny-gcnn", "tiny-transformer")
READ_TIMEOUT = 10.0  # a stream silent this long counts as hung
LONG_TOKENS = 4000  # long enough to be mid-stream when its replica dies (LSTM: up to 4096 tokens)


@dataclass
class Outcome:
    stream: bool
    status: int = 0
    upstream: str = ""  # the replica that answered last (nginx lists every one it tried)
    complete: bool = False  # a whole JSON body, or a stream that reached [DONE]
    ended_by: str = ""  # a stream cut short: the transport error that ended it
    events: int = 0
    tried: list[str] = field(default_factory=list)


def record_upstream(outcome: Outcome, response: httpx.Response) -> None:
    outcome.status = response.status_code
    outcome.tried = [a.strip() for a in response.headers.get("x-upstream-addr", "").split(",") if a.strip()]
    outcome.upstream = outcome.tried[-1] if outcome.tried else ""


def request(client: httpx.Client, i: int, stream: bool) -> Outcome:
    body = {"model": MODELS[i % len(MODELS)], "prompt": "To be", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    outcome = Outcome(stream)
    if not stream:
        response = client.post("/v1/completions", json=body)
        record_upstream(outcome, response)
        outcome.complete = response.status_code == 200 and isinstance(response.json()["choices"][0]["text"], str)
        return outcome
    with client.stream("POST", "/v1/completions", json=body) as response:
        record_upstream(outcome, response)
        read_events(outcome, response.iter_lines())
    return outcome


def read_events(outcome: Outcome, lines, stop: threading.Event | None = None, after_stop: int = 0) -> None:
    """Reads SSE lines to the end, recording how the stream ended; a ReadTimeout (a hang) propagates."""
    try:
        for line in lines:
            if not line.startswith("data: "):
                continue
            outcome.events += 1
            if line == "data: [DONE]":
                outcome.complete = True
            if stop is not None and stop.is_set():
                after_stop -= 1
                if after_stop <= 0:
                    return  # the client goes away
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        outcome.ended_by = type(e).__name__


def metric(url: str, family: str, sample: str | None = None) -> float:
    """A metric summed over its labels, from a replica's own /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == family
               for s in f.samples if s.name == (sample or family))


def served(url: str) -> int:
    """Requests a replica finished."""
    return int(metric(url, "quill_requests", "quill_requests_total"))


def wait_for(read, expected, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def wait_for_count(url: str, expected: int) -> int:
    return wait_for(lambda: served(url), expected)


def wait_for_gauge(url: str, name: str, expected: float) -> float:
    return wait_for(lambda: metric(url, name), expected)


@pytest.fixture
def cluster(tiny_checkpoints, tmp_path):
    nginx_bin = require_tool("nginx")
    replicas = [LiveServer(tiny_checkpoints, "--max-tokens-limit", "4096") for _ in range(2)]
    nginx = None
    try:
        for replica in replicas:
            replica.wait_ready()
        nginx = Nginx(nginx_bin, tmp_path / "nginx", [f"127.0.0.1:{r.port}" for r in replicas], free_port())
        nginx.wait_ready()
        yield nginx, {f"127.0.0.1:{r.port}": r for r in replicas}
    finally:
        if nginx is not None:
            nginx.stop()
        for replica in replicas:
            replica.stop()


def long_stream(client: httpx.Client, outcome: Outcome, started: threading.Event, stop: threading.Event) -> None:
    body = {"model": "tiny-lstm", "prompt": "To be", "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True}
    try:
        with client.stream("POST", "/v1/completions", json=body) as response:
            record_upstream(outcome, response)
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    outcome.events += 1
                    break
            started.set()
            read_events(outcome, lines, stop, after_stop=20)  # survivors: 20 more events after the kill, then leave
    except httpx.ReadTimeout:
        outcome.ended_by = "hung"
    finally:
        started.set()


def test_replica_killed_mid_run(cluster):
    nginx, replicas = cluster
    timeout = httpx.Timeout(READ_TIMEOUT, connect=5.0)
    with httpx.Client(base_url=nginx.url, timeout=timeout) as client, ThreadPoolExecutor(4) as pool:
        # 1. 16 mixed requests on two healthy replicas.
        first = list(pool.map(lambda i: request(client, i, stream=i % 2 == 1), range(16)))
        assert all(o.status == 200 and o.complete for o in first), first
        tally = {address: sum(o.upstream == address for o in first) for address in replicas}
        assert all(n > 0 for n in tally.values()), f"least_conn used one replica only: {tally}"
        for address, replica in replicas.items():
            assert wait_for_count(replica.url, tally[address]) == tally[address]

        # 2. Four long streams, opened one after another: least_conn puts two on each replica.
        stop = threading.Event()
        streams = [Outcome(stream=True) for _ in range(4)]
        threads = []
        for outcome in streams:
            started = threading.Event()
            threads.append(threading.Thread(target=long_stream, args=(client, outcome, started, stop), daemon=True))
            threads[-1].start()
            assert started.wait(30) and outcome.status == 200 and outcome.events >= 1, outcome
        victim_address = streams[0].upstream
        (survivor_address,) = set(replicas) - {victim_address}
        victim, survivor = replicas[victim_address], replicas[survivor_address]
        assert sorted(o.upstream for o in streams).count(victim_address) == 2
        assert served(victim.url) == tally[victim_address]  # scraped before it dies

        # 3. 20 more requests while the victim is SIGKILLed.
        later = [pool.submit(request, client, i, i % 2 == 1) for i in range(20)]
        victim.process.kill()
        victim.process.wait(timeout=10)
        stop.set()
        outcomes = [f.result(timeout=60) for f in later]
        for t in threads:
            t.join(timeout=READ_TIMEOUT + 5)
            assert not t.is_alive(), "a stream hung"

    for outcome in streams:
        assert outcome.ended_by != "hung", f"a stream hung: {outcome}"
        if outcome.upstream == victim_address:
            # Cut mid-way (nginx closes the response before its last chunk) or, had it finished first, whole.
            assert outcome.ended_by or outcome.complete, outcome
        else:
            assert not outcome.ended_by and outcome.events >= 20, f"a survivor's stream suffered: {outcome}"

    for outcome in outcomes:
        assert outcome.status == 200, outcome
        if not outcome.stream:
            assert outcome.complete, outcome  # retried on the survivor when the victim failed
        elif not outcome.complete:
            # Only a stream already under way on the victim may be cut; never one on the survivor.
            assert outcome.ended_by and outcome.upstream == victim_address, outcome
    assert sum(o.complete for o in outcomes) >= 16
    retried = [o for o in outcomes if o.tried[:1] == [victim_address] and o.upstream == survivor_address]
    assert retried, "no request was resent from the dead replica to the survivor"

    # The survivor counted everything it finished: phase 1 and the requests of phase 3 it answered. Its two
    # long streams were left by their client: nginx closed them upstream and the survivor aborted them (a
    # request the client leaves is not a finished one, so it is not in quill_requests_total).
    expected = tally[survivor_address] + sum(o.upstream == survivor_address for o in outcomes)
    assert wait_for_count(survivor.url, expected) == expected
    assert wait_for_gauge(survivor.url, "quill_num_requests_running", 0) == 0
    assert re.search(r"upstream|connect\(\) failed|prematurely", nginx.error_log()), "nginx saw the replica die"
