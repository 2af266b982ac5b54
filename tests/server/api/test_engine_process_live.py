"""The real server with each model's engine core in a process of its own (--engine-process): dropped
streams abort, a full queue answers 429 before any byte, and a crashed engine process is reported while
the other models keep serving. (SIGTERM drain in this mode: test_live_server.py.)"""

from __future__ import annotations

import os
import re
import signal
import time

import httpx
import pytest

from tests.server.api.conftest import LiveServer
from tests.server.api.test_live_server import metric


@pytest.fixture(scope="module")
def process_server(tiny_checkpoints):
    models = {name: tiny_checkpoints[name] for name in ("tiny-lstm", "tiny-gcnn")}
    with LiveServer(models, "--engine-process", "--max-num-seqs", "1", "--max-queue", "1",
                    "--max-tokens-limit", "2000") as server:
        yield server


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def long_stream(url: str, model: str) -> httpx.Response:
    return httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
        "model": model, "prompt": "To be", "max_tokens": 1900, "stream": True, "ignore_eos": True})


def test_streams_coalesce_and_complete(process_server):
    with httpx.stream("POST", f"{process_server.url}/v1/completions", timeout=30, json={
        "model": "tiny-lstm", "prompt": "To be", "max_tokens": 40, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    assert '"completion_tokens":40' in lines[-2]


def test_dropped_stream_aborts_in_the_engine_process(process_server):
    url = process_server.url
    with long_stream(url, "tiny-lstm") as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # the client goes away mid-stream
    assert wait_for(lambda: metric(url, "quill_num_requests_running", "tiny-lstm") == 0
                    and metric(url, "quill_cache_usage_ratio", "tiny-lstm") == 0)


def test_full_queue_answers_429_before_any_byte(tiny_checkpoints):
    # A server whose engine holds once it runs a request (held_outputs_serve): the first request cannot finish and
    # let the second in, however fast the machine generates.
    gcnn = {"tiny-gcnn": tiny_checkpoints["tiny-gcnn"]}
    server = LiveServer(gcnn, "--engine-process", "--max-num-seqs", "1", "--max-queue", "1",
                        "--max-tokens-limit", "2000", module="tests.server.api.held_outputs_serve")
    try:
        server.wait_ready()
        url = server.url
        with long_stream(url, "tiny-gcnn") as running:
            assert running.status_code == 200
            assert wait_for(lambda: metric(url, "quill_num_requests_running", "tiny-gcnn") == 1)
            with long_stream(url, "tiny-gcnn") as queued:  # waiting: the one batch slot is taken
                assert queued.status_code == 200
                refused = httpx.post(f"{url}/v1/completions", timeout=10, json={
                    "model": "tiny-gcnn", "prompt": "x", "max_tokens": 5, "stream": True})
    finally:
        server.process.send_signal(signal.SIGUSR1)
        server.stop()
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert "queue is full" in refused.json()["error"]["message"]


def test_a_crashed_engine_process_is_reported_and_others_keep_serving(tiny_checkpoints):
    models = {name: tiny_checkpoints[name] for name in ("tiny-lstm", "tiny-gcnn")}
    with LiveServer(models, "--engine-process", "--max-tokens-limit", "2000") as server:
        pid = int(re.search(r"tiny-gcnn: engine process started \(pid (\d+)\)", server.output()).group(1))
        with long_stream(server.url, "tiny-gcnn") as r:
            lines = r.iter_lines()
            next(lines)  # the stream has started
            os.kill(pid, signal.SIGKILL)
            rest = list(lines)
        assert any('"error"' in line and "engine process exited" in line for line in rest)
        assert rest[-1] != "data: [DONE]"
        assert wait_for(lambda: httpx.get(f"{server.url}/ready").status_code == 503)
        ready, health = httpx.get(f"{server.url}/ready"), httpx.get(f"{server.url}/health")
        assert ready.json()["models"] == ["tiny-gcnn"]
        assert health.status_code == 503 and "exit code -9" in health.json()["models"]["tiny-gcnn"]
        refused = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny-gcnn", "prompt": "x", "max_tokens": 2})
        assert refused.status_code == 503 and "engine process exited" in refused.json()["error"]["message"]
        served = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny-lstm", "prompt": "x", "max_tokens": 2})
        assert served.status_code == 200
