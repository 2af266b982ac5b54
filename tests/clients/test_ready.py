"""wait_until_ready: returns on the first 200, fails fast when the process is gone, times out otherwise."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quill.clients.ready import wait_until_ready
from tests.conftest import free_port


class Probe(BaseHTTPRequestHandler):
    """/ready answers 503 until the server's `ready_at` time, then 200; anything else 404."""

    def do_GET(self):
        if self.path != "/ready":
            self.send_response(404)
        else:
            self.send_response(200 if time.monotonic() >= self.server.ready_at else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def loading_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Probe)
    server.ready_at = time.monotonic() + 0.5
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_returns_once_the_probe_answers_200(loading_server):
    url = f"http://127.0.0.1:{loading_server.server_address[1]}"
    wait_until_ready(url, timeout=10, interval=0.05)
    assert time.monotonic() >= loading_server.ready_at


def test_a_wrong_path_never_becomes_ready(loading_server):
    url = f"http://127.0.0.1:{loading_server.server_address[1]}"
    with pytest.raises(TimeoutError, match="/nginx-health"):
        wait_until_ready(url, timeout=0.8, path="/nginx-health", interval=0.05)


def test_a_process_that_exits_fails_at_once(monkeypatch):
    """At once: before any probe or wait (not a wall-clock bound, which a busy machine could exceed)."""
    def never(*args, **kwargs):
        raise AssertionError("probed or waited for a process that had exited")

    monkeypatch.setattr("quill.clients.ready.httpx.get", never)
    monkeypatch.setattr("quill.clients.ready.time.sleep", never)
    with pytest.raises(RuntimeError, match="stopped before"):
        wait_until_ready(f"http://127.0.0.1:{free_port()}", timeout=30, still_starting=lambda: False)


def test_nothing_listening_times_out():
    with pytest.raises(TimeoutError):
        wait_until_ready(f"http://127.0.0.1:{free_port()}", timeout=0.3, interval=0.05)
