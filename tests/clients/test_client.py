"""The Python client and the command-line client against a real server on a loopback port."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import httpx
import pytest

from quill.clients import AsyncClient, Client, QuillConnectionError, QuillError
from quill.clients.request import completion_body, retry_delay
from tests.conftest import LiveServer, free_port


def test_complete_stream_models_health(live_server):
    with Client(live_server.url) as client:
        assert client.health()
        assert [m.id for m in client.models()] == ["tiny-transformer", "tiny-lstm", "tiny-gcnn"]
        done = client.complete("To be", model="tiny-lstm", max_tokens=6, temperature=0, ignore_eos=True, logprobs=1)
        assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
        assert len(done.choices[0].logprobs.token_logprobs) == 6
        streamed = "".join(client.stream("To be", model="tiny-lstm", max_tokens=6, temperature=0, ignore_eos=True))
        assert streamed == done.text
        beams = client.complete("To be", model="tiny-gcnn", max_tokens=5, beam_width=3, n=2)
        assert len(beams.choices) == 2


def test_async_client(live_server):
    async def main():
        async with AsyncClient(live_server.url) as client:
            assert await client.health()
            done = await client.complete("To be", max_tokens=5, temperature=0, ignore_eos=True)
            parts = [t async for t in client.stream("To be", max_tokens=5, temperature=0, ignore_eos=True)]
            return done.text, "".join(parts), await client.models()

    text, streamed, models = asyncio.run(main())
    assert text == streamed and len(models) == 3


def test_errors_carry_status_message_and_type(live_server):
    with Client(live_server.url, max_retries=0) as client:
        with pytest.raises(QuillError) as info:
            client.complete("x", temperature=-1)
        assert info.value.status == 400 and info.value.error_type == "invalid_request_error"
        assert info.value.param == "temperature" and "temperature" in info.value.message
        with pytest.raises(QuillError) as info:
            list(client.stream("x", model="nope"))
        assert info.value.status == 404
        with pytest.raises(TypeError):
            client.complete("x", temprature=1)  # a misspelt option is caught before any request
    with Client(f"http://127.0.0.1:{free_port()}") as dead:
        assert not dead.health()
        with pytest.raises(QuillConnectionError):
            dead.complete("x")


def test_retries_on_429_honouring_retry_after(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints, "--max-queue", "1", "--max-num-seqs", "1")
    server.wait_ready()
    stop = threading.Event()

    def keep_busy():  # keeps one request running and one waiting until told to stop
        with httpx.Client(base_url=server.url, timeout=60) as c:
            while not stop.is_set():
                c.post("/v1/completions", json={"model": "tiny-lstm", "prompt": "x", "max_tokens": 250,
                                                "ignore_eos": True})

    busy = [threading.Thread(target=keep_busy) for _ in range(3)]
    try:
        for t in busy:
            t.start()
        with Client(server.url, max_retries=0) as impatient:
            for _ in range(500):
                try:
                    impatient.complete("x", model="tiny-lstm", max_tokens=1)
                except QuillError as e:
                    assert e.status == 429 and e.error_type == "rate_limit_error"
                    break
            else:
                pytest.fail("the queue never filled")
        stop.set()  # the load drains; a patient client waits Retry-After (1 s) between tries and gets in
        with Client(server.url, max_retries=30) as patient:
            assert patient.complete("x", model="tiny-lstm", max_tokens=2, ignore_eos=True).usage.completion_tokens == 2
    finally:
        stop.set()
        for t in busy:
            t.join(timeout=60)
        server.stop()


def test_options_map_to_the_api():
    body = completion_body("p", beam_width=4, max_tokens=3, top_k=None)
    assert body == {"prompt": "p", "stream": False, "use_beam_search": True, "best_of": 4, "temperature": 0,
                    "max_tokens": 3}
    assert retry_delay(0, "2", 0.5) == 2.0
    assert 0.25 <= retry_delay(1, None, 0.25) <= 0.5


def quill(*args):
    return subprocess.run([sys.executable, "-m", "quill.cli", *args], capture_output=True, text=True, timeout=120)


def test_command_line_complete_and_compare(live_server):
    r = quill("complete", "To be", "--url", live_server.url, "--model", "tiny-lstm", "--max-tokens", "5",
              "--temperature", "0")
    assert r.returncode == 0 and r.stdout.strip()
    s = quill("complete", "To be", "--url", live_server.url, "--model", "tiny-lstm", "--max-tokens", "5",
              "--temperature", "0", "--stream")
    assert s.returncode == 0 and s.stdout == r.stdout
    bad = quill("complete", "x", "--url", live_server.url, "--temperature", "-3")
    assert bad.returncode == 1 and "temperature" in bad.stderr
    c = quill("compare", "To be", "--url", live_server.url, "--max-tokens", "8")
    assert c.returncode == 0, c.stderr
    for name in ("tiny-transformer", "tiny-lstm", "tiny-gcnn", "greedy", "beam", "top-k", "top-p", "temperature"):
        assert name in c.stdout


def test_retry_policy_waits_retry_after_and_gives_up(monkeypatch):
    """The retry mechanics on a scripted transport: 429, 503, then success; never retries a 400."""
    answers = iter([httpx.Response(429, headers={"Retry-After": "2"}, json={"error": {"message": "full"}}),
                    httpx.Response(503, json={"error": {"message": "draining"}}),
                    httpx.Response(200, json={"id": "c", "model": "m", "choices": [
                        {"index": 0, "text": "ok", "finish_reason": "length"}]})])
    waits = []
    monkeypatch.setattr("quill.clients.client.time.sleep", waits.append)
    with Client("http://127.0.0.1:9", max_retries=3, backoff=0.1) as client:
        client._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(lambda r: next(answers)))
        assert client.complete("x").text == "ok"
    assert waits[0] == 2.0 and 0.05 <= waits[1] <= 0.2  # Retry-After honoured, then backoff with jitter
    with Client("http://127.0.0.1:9", max_retries=3) as client:
        client._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(
            lambda r: httpx.Response(400, json={"error": {"message": "bad", "type": "invalid_request_error"}})))
        with pytest.raises(QuillError):
            client.complete("x")
    assert len(waits) == 2
