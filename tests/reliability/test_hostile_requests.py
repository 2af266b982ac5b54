"""A table of hostile requests for both dialects: each gets its documented 4xx, and nothing else is affected."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.conftest import LiveServer

HUGE = "x " * 300_000  # about 600 KB of prompt: under the body limit, far over every context


def raw(body: str) -> bytes:
    return body.encode("utf-8", "surrogatepass")


# (route, body bytes or JSON-able, expected status). Bodies that are not JSON-able are given as bytes.
CASES = [
    ("/v1/completions", {"prompt": HUGE, "max_tokens": 4}, 400),
    ("/generate", {"inputs": HUGE, "parameters": {"max_new_tokens": 4}}, 400),
    ("/v1/completions", {"prompt": "x", "n": 10**9}, 400),
    ("/v1/completions", {"prompt": "x", "best_of": 10**6, "use_beam_search": True}, 400),
    ("/generate", {"inputs": "x", "parameters": {"num_beams": 10**6}}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**12}, 400),
    ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 10**12}}, 400),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400),
    ("/v1/completions", b'{"prompt": "x", "top_p": Infinity}', 400),
    ("/v1/completions", b'{"prompt": "x", "temperature": -Infinity}', 400),
    ("/generate", b'{"inputs": "x", "parameters": {"temperature": NaN}}', 400),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400),
    ("/v1/completions", {"prompt": "x", "seed": -(2**70)}, 400),
    ("/v1/completions", {"prompt": ["x", 3]}, 400),
    ("/v1/completions", {"prompt": {"text": "x"}}, 400),
    ("/v1/completions", {"prompt": "x", "stop": [1, 2]}, 400),
    ("/generate", {"inputs": 42}, 400),
    ("/generate", {"inputs": "x", "parameters": "fast"}, 400),
    ("/v1/completions", {"prompt": "", "max_tokens": 2}, 400),
    ("/v1/completions", {"prompt": "   \n\t ", "max_tokens": 2}, 200),  # whitespace is text: it tokenizes
    ("/generate", {"inputs": "", "parameters": {"max_new_tokens": 2}}, 400),
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 10_000}, 400),
    ("/generate", {"inputs": "x", "parameters": {"stop": ["s"] * 10_000}}, 400),
    ("/v1/completions", {"prompt": "x", "stop": ["s" * 100_000]}, 400),
    ("/v1/completions", raw('{"prompt": "\\ud800 lone surrogate", "max_tokens": 2}'), 400),
    ("/generate", raw('{"inputs": "lone \\udfff", "parameters": {"max_new_tokens": 2}}'), 400),
    ("/v1/completions", {"prompt": "e\u0301\u0301\u0301 combining \u0308\u0308", "max_tokens": 2}, 200),
    ("/v1/completions", {"prompt": "🎉👩‍👩‍👧‍👦🏳️‍🌈", "max_tokens": 3, "ignore_eos": True}, 200),
    ("/generate", {"inputs": "🎉 ж 日本", "parameters": {"max_new_tokens": 3}}, 200),
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400),
    ("/v1/completions", b'{"prompt": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}", 400),
    ("/v1/completions", b"", 400),
    ("/v1/completions", b"null", 400),
    ("/v1/completions", b"\xff\xfe not utf-8", 400),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 5}}, 400),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, 400),
    ("/v1/completions", {"prompt": [10**9], "max_tokens": 1}, 400),
]


@pytest.mark.parametrize("route,body,status", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
async def test_hostile_request_gets_its_status(client, route, body, status):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = await client.post(route, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text[:300]
    if status >= 400:
        error = r.json()["error"]
        assert error if route != "/v1/completions" else error["message"]


async def test_wrong_content_type_and_oversized_body(client, app):
    r = await client.post("/v1/completions", content=b"prompt=x", headers={"content-type": "text/plain"})
    assert r.status_code == 400
    big = b'{"prompt": "' + b"x" * (app.state.config.max_body_bytes + 1) + b'"}'
    for route in ("/v1/completions", "/generate"):
        r = await client.post(route, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413


async def test_nothing_else_is_affected(client):
    """After the whole table, the server still answers a normal request normally."""
    r = await client.post("/v1/completions", json={"prompt": "To be", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert (await client.get("/ready")).status_code == 200


def test_slow_loris_bodies_are_cut_off(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints, "--body-timeout", "1")
    server.wait_ready()
    try:
        socks = []
        for _ in range(3):  # several slow clients at once, each dribbling a body it never finishes
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
            socks.append(s)
        start = time.monotonic()
        # Meanwhile a normal client is served.
        ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert ok.status_code == 200
        for s in socks:
            s.sendall(b'"x')  # a trickle, not the body
            answer = s.recv(4096).decode()
            assert answer.startswith("HTTP/1.1 408"), answer[:200]
            s.close()
        assert time.monotonic() - start < 10
    finally:
        server.stop()
