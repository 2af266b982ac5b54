"""The real server process on a loopback port: the official openai client, dropped streams, SIGTERM (while
serving, and while loading)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest

from tests.server.api.conftest import LiveServer
from tests.server.api.held_engine_serve import HELD_MESSAGE
from tests.server.api.held_outputs_serve import HELD_MESSAGE as HELD_OUTPUTS


def metric(url: str, name: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf'^{name}{{model="{model}"}} (\S+)$', text, re.M)
    return float(match.group(1))


def test_openai_client_completions(live_server):
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused")
    models = [m.id for m in client.models.list()]
    assert models == ["tiny-transformer", "tiny-lstm", "tiny-gcnn"]
    for model in models:
        done = client.completions.create(model=model, prompt="To be", max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True})
        assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 5
    scored = client.completions.create(model="tiny-lstm", prompt="To be", max_tokens=3, logprobs=2, echo=True,
                                       extra_body={"ignore_eos": True})
    lp = scored.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.token_logprobs)
    beams = client.completions.create(model="tiny-gcnn", prompt="To be", max_tokens=4, n=2, best_of=3,
                                      extra_body={"use_beam_search": True})
    assert len(beams.choices) == 2


def test_openai_client_streaming(live_server):
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused")
    stream = client.completions.create(model="tiny-transformer", prompt="To be", max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 8
    whole = client.completions.create(model="tiny-transformer", prompt="To be", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert text == whole.choices[0].text


def test_openai_client_sees_errors(live_server):
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny-lstm", prompt="x", max_tokens=5, temperature=-1)
    assert "temperature" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=5)


def test_openai_client_completions_with_every_argument_quill_takes(live_server):
    """Each argument of completions.create off its default but suffix (refused: Quill has no insertion), none in
    extra_body: whatever the client puts in the body is a field the route knows."""
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)
    options = dict(model="tiny-transformer", prompt=["To be", "or not"], max_tokens=4, temperature=0.8, top_p=0.9,
                   n=2, logprobs=2, echo=True, stop=["\n\n"], seed=3, presence_penalty=0.5, frequency_penalty=0.5,
                   logit_bias={"5": -1}, user="u-1")
    done = client.completions.create(best_of=3, **options)
    assert len(done.choices) == 4 and all(c.logprobs.tokens for c in done.choices)
    chunks = list(client.completions.create(best_of=2, stream=True, stream_options={"include_usage": True}, **options))
    assert chunks[-1].usage.completion_tokens > 0 and {c.choices[0].index for c in chunks if c.choices} == {0, 1, 2, 3}


def test_openai_client_hears_which_argument_is_unknown(live_server):
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny-lstm", prompt="x", extra_body={"max_tokns": 5})
    assert info.value.param == "max_tokns" and info.value.type == "invalid_request_error"
    assert "Unrecognized request argument supplied: max_tokns" in info.value.message


def test_dropped_streams_free_their_cache(live_server):
    for model in ("tiny-transformer", "tiny-lstm"):
        for _ in range(3):
            with httpx.stream("POST", f"{live_server.url}/v1/completions", timeout=30, json={
                "model": model, "prompt": "To be", "max_tokens": 250 if model != "tiny-transformer" else 50,
                "stream": True, "ignore_eos": True,
            }) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i > 3:
                        break  # the client goes away mid-stream
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if metric(live_server.url, "quill_cache_usage_ratio", model) == 0 and \
                    metric(live_server.url, "quill_num_requests_running", model) == 0:
                break
            time.sleep(0.1)
        assert metric(live_server.url, "quill_cache_usage_ratio", model) == 0
        assert metric(live_server.url, "quill_num_requests_running", model) == 0


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
def test_metrics_pass_promtool(live_server):
    httpx.post(f"{live_server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
    text = httpx.get(f"{live_server.url}/metrics").text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("engine", ["--no-engine-process", "--engine-process"])
def test_sigterm_drains_in_flight_requests_then_exits_zero(tiny_checkpoints, engine):
    # The engine holds at its first step that runs a request until SIGUSR1 (held_outputs_serve): SIGTERM comes once
    # all four requests are in flight, and they are still in flight then, however fast the machine generates.
    lstm = {"tiny-lstm": tiny_checkpoints["tiny-lstm"]}
    server = LiveServer(lstm, "--drain-seconds", "60", engine, module="tests.server.api.held_outputs_serve")
    server.wait_ready()
    results = {}

    def long_request(i):
        # A timeout well past the drain's own length: on a loaded machine these take tens of seconds.
        try:
            r = httpx.post(f"{server.url}/v1/completions", timeout=150, json={
                "model": "tiny-lstm", "prompt": "To be", "max_tokens": 200, "n": 2, "ignore_eos": True})
        except httpx.HTTPError as e:
            results[i] = None, repr(e)
            return
        results[i] = r.status_code, (r.json() if r.status_code == 200 else r.text)

    workers = [threading.Thread(target=long_request, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 60  # only a bound: held, the engine lets none of them finish
        while f"{HELD_OUTPUTS}: 4" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        ready = httpx.get(f"{server.url}/ready", timeout=5)  # the handler has run before the server reads this
        refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
        still_running = metric(server.url, "quill_num_requests_running", "tiny-lstm")
    finally:
        server.process.send_signal(signal.SIGUSR1)  # the engine goes on: the drain lets every request finish
    for w in workers:
        w.join(timeout=160)
    server.process.wait(timeout=60)
    assert still_running > 0, "the requests finished before the drain could be observed"
    assert ready.status_code == 503 and refused.status_code == 503
    for status, body in results.values():  # in-flight requests ran to the end
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 2 * 200
    assert len(results) == 4 and server.process.returncode == 0


def is_running(pid: int) -> bool:
    """A process that exists and is not a zombie (a container's init may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def test_sigterm_while_an_engine_process_loads_ends_it_and_exits_zero(tiny_checkpoints):
    """The engine process (which ignores SIGTERM) holds in its load: SIGTERM to the server ends it, starts no
    engine, and the server exits 0 at once (it used to wait on the engine process forever)."""
    lstm = {"tiny-lstm": tiny_checkpoints["tiny-lstm"]}
    server = LiveServer(lstm, "--engine-process", module="tests.server.api.held_engine_serve")
    try:
        deadline = time.monotonic() + 60
        while HELD_MESSAGE not in server.output() and server.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert HELD_MESSAGE in server.output(), server.output()
        engine_pid = int(re.search(r"engine process started \(pid (\d+)\)", server.output()).group(1))
        server.process.send_signal(signal.SIGTERM)
        try:
            returncode = server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            returncode = None
    finally:
        output = server.stop()
        if "engine_pid" in locals() and is_running(engine_pid):
            os.kill(engine_pid, signal.SIGKILL)
    assert returncode == 0, output
    assert not is_running(engine_pid)
    assert "loading stopped" in output and "ready:" not in output
