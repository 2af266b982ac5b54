"""A real server whose only engine loses its device: the request fails with the reason, and the server exits with
ENGINES_DEAD_EXIT_CODE for its supervisor to restart it, with the engine on a thread or in a process of its own."""

from __future__ import annotations

import httpx
import pytest

from quill.server.serve import ENGINES_DEAD_EXIT_CODE
from tests.server.api.conftest import LiveServer


@pytest.mark.parametrize("engine", ["--no-engine-process", "--engine-process"])
def test_a_lost_device_fails_the_request_and_the_server_exits_for_a_restart(tiny_checkpoints, engine):
    lstm = {"tiny-lstm": tiny_checkpoints["tiny-lstm"]}
    server = LiveServer(lstm, engine, module="tests.server.api.lost_device_serve")
    try:
        server.wait_ready()
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=30)
        returncode = server.exit_code(timeout=30)
    finally:
        output = server.stop()
    assert r.status_code == 503, r.text
    assert "illegal memory access" in r.json()["error"]["message"] and "restarted" in r.json()["error"]["message"]
    assert returncode == ENGINES_DEAD_EXIT_CODE, output
    assert "no engine is alive" in output
