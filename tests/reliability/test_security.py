"""Keys, paths, CORS and logs: what a hostile or careless client must never get."""

from __future__ import annotations

import json

import httpx

from tests.conftest import LiveServer

KEY = "sk-quill-test-secret-0123456789"


def test_keys_logs_paths_and_cors(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints, "--api-key", KEY, "--api-key", "second-key")
    server.wait_ready()
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        # Every endpoint but the probes, the scrape and the playground page needs the key.
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/generate"),
                             ("POST", "/generate_stream"), ("POST", "/"), ("GET", "/docs"), ("GET", "/openapi.json")]:
            r = httpx.request(method, f"{server.url}{path}", json={"prompt": "x", "inputs": "x"})
            assert r.status_code == 401, path
        for path in ("/health", "/ready", "/metrics", "/playground", "/", "/languages"):
            assert httpx.get(f"{server.url}{path}").status_code == 200, path
        # LibreTranslate's clients send the key as a field: a wrong or missing one is refused before the route,
        # a right one reaches the route (which refuses the request itself: no source language, no translation model)
        for data in ({"q": "x", "target": "fr"}, {"q": "x", "target": "fr", "api_key": "wrong"}):
            assert httpx.post(f"{server.url}/translate", data=data).status_code == 401
            assert httpx.post(f"{server.url}/translate", json=data).status_code == 401
        assert httpx.post(f"{server.url}/translate", data={"q": "x", "target": "fr", "api_key": KEY}).status_code in (400, 404)
        # never from the query string, which access logs print
        assert httpx.post(f"{server.url}/translate?api_key=second-key", data={"q": "x", "target": "fr"}
                          ).status_code == 401
        assert httpx.post(f"{server.url}/translate", json={"q": "x", "target": "fr", "api_key": "second-key"}
                          ).status_code in (400, 404)
        secret_prompt = "my very private prompt text"
        r = httpx.post(f"{server.url}/v1/completions", headers=auth,
                       json={"prompt": secret_prompt, "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200
        # Nothing a request says makes the server read a file: model names are names, not paths.
        for name in ("../../../etc/passwd", "/etc/passwd", str(tiny_checkpoints["tiny-lstm"])):
            r = httpx.post(f"{server.url}/v1/completions", headers=auth, json={"model": name, "prompt": "x"})
            assert r.status_code == 404 and "passwd" not in r.json()["error"]["message"].replace(name, "")
        # CORS is off: no browser on another origin may call the API.
        r = httpx.options(f"{server.url}/v1/completions", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in r.headers
    finally:
        log = server.stop()
    assert KEY not in log and "second-key" not in log.replace("/translate?api_key=second-key", "")
    assert secret_prompt not in log
    lines = [json.loads(line.split("quill.requests: ", 1)[1]) for line in log.splitlines() if "quill.requests: " in line]
    done = [rec for rec in lines if rec["status"] == 200]
    assert done and set(done[0]) == {"request_id", "model", "status", "prompt_tokens", "generated_tokens",
                                     "latency_s", "finish_reason"}


def test_prompts_are_logged_only_when_asked(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints, "--log-prompts")
    server.wait_ready()
    try:
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "a loggable prompt", "max_tokens": 2})
    finally:
        log = server.stop()
    assert '"prompt": "a loggable prompt"' in log
