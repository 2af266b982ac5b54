"""While the models load, every route that needs them answers 503 in its dialect, with Retry-After, as
/ready does; none answers 500. The real server is tested with its load held open, then let go; and
stopped while it loads, which starts no engine."""

from __future__ import annotations

import multiprocessing
import signal

import httpx
import pytest

from quill.server import serve
from quill.server.api.app import create_app
from quill.server.api.errors import is_openai_path
from quill.server.api.generation import LOADING_RETRY_AFTER_SECONDS
from tests.conftest import free_port
from tests.server.api.conftest import server_config
from tests.server.api.held_server import HeldLoadServer

# A valid body for every route of the OpenAPI document that takes one, so the refusal is about loading.
BODIES = {
    "/v1/completions": {"prompt": "To be", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "To be"}], "max_tokens": 2},
    "/tokenize": {"prompt": "To be"},
    "/detokenize": {"tokens": [1, 2]},
    "/generate": {"inputs": "To be", "parameters": {"max_new_tokens": 2}},
    "/generate_stream": {"inputs": "To be", "parameters": {"max_new_tokens": 2}},
    "/": {"inputs": "To be", "parameters": {"max_new_tokens": 2}},
    "/v1/structured/allowed": {"structured_outputs": {"regex": "a+"}, "text": ""},
}
NEEDS_NO_MODEL = {"/health", "/metrics"}  # alive and scrapeable while loading; /ready has its own 503


def assert_refused_while_loading(response: httpx.Response, path: str) -> None:
    assert response.status_code == 503, (path, response.text)
    assert response.headers["Retry-After"] == str(LOADING_RETRY_AFTER_SECONDS), path
    body = response.json()
    if is_openai_path(path):
        assert body["error"]["type"] == "service_unavailable" and set(body["error"]) == {"message", "type", "param",
                                                                                          "code"}, path
        message = body["error"]["message"]
    else:
        assert body["error_type"] == "unavailable", path
        message = body["error"]
    assert message.startswith("the models are still loading; retry shortly"), path


async def test_every_route_answers_while_loading(tiny_checkpoints):
    app = create_app(None, server_config(tiny_checkpoints))
    routes = [(path, method) for path, methods in app.openapi()["paths"].items() for method in methods]
    assert len(routes) >= len(BODIES) + 4  # the whole document: every route added later is checked too
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as c:
        for path, method in routes:
            response = await c.request(method, path, json=BODIES.get(path))
            if path in NEEDS_NO_MODEL:
                assert response.status_code == 200, path
            elif path == "/ready":
                assert (response.status_code, response.json()) == (503, {"status": "loading"})
            else:
                assert_refused_while_loading(response, path)
        playground = await c.get("/playground")  # the page itself needs no model; it asks /v1/models
        assert playground.status_code == 200


def test_a_loading_server_refuses_then_serves(tiny_checkpoints):
    with HeldLoadServer(server_config(tiny_checkpoints, port=free_port())) as held:
        url = held.url
        assert httpx.get(f"{url}/ready").status_code == 503
        for path in ("/v1/models", "/info"):
            assert_refused_while_loading(httpx.get(url + path), path)
        assert_refused_while_loading(httpx.post(f"{url}/tokenize", json=BODIES["/tokenize"]), "/tokenize")
        held.release()
        held.wait_ready()
        listed = httpx.get(f"{url}/v1/models")
        assert listed.status_code == 200 and "Retry-After" not in listed.headers
        assert [m["id"] for m in listed.json()["data"]] == list(tiny_checkpoints)
        info = httpx.get(f"{url}/info").json()
        assert info["model_id"] == tiny_checkpoints[next(iter(tiny_checkpoints))]
        assert httpx.post(f"{url}/tokenize", json=BODIES["/tokenize"]).json()["count"] > 0
    assert held.server.exit_code == 0



@pytest.mark.parametrize("separate", [False, True], ids=["thread", "process"])
def test_sigterm_while_loading_stops_the_load_and_starts_no_engine(tiny_checkpoints, separate, monkeypatch):
    """SIGTERM with the first model loaded (its engine process running, with `separate`) and the second one
    loading in this process: the server waits LOADER_STOP_SECONDS for that load, then exits 0; when the load
    ends after that, no engine starts, and the first model's engine is shut down."""
    monkeypatch.setattr(serve, "LOADER_STOP_SECONDS", 1.0)
    children = set(multiprocessing.active_children())
    config = server_config(tiny_checkpoints, port=free_port(), engine_process=separate)
    with HeldLoadServer(config, held_model=2) as held:
        held.wait_held()
        held.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's SIGTERM handler calls
        assert held.wait_stopped(10), "the server did not stop within 10s of SIGTERM"
        held.release()  # the load in progress ends after the server stopped
        held.loader.join(10)  # had it gone on to start the engines, it would have by now
    assert held.server.exit_code == 0 and not held.loader.is_alive()
    assert held.hosted and not any(hosted.engine.is_alive for hosted in held.hosted)
    assert set(multiprocessing.active_children()) <= children  # no engine process left behind
