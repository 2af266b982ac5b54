"""The real server (`quill serve`'s, uvicorn and the loader thread) on a thread of the test process, on a
loopback port, with its models' load held open until the test lets it go: for what clients see while
a server loads, and for a server that stops while it loads."""

from __future__ import annotations

import threading
from unittest import mock

from quill.clients.ready import wait_until_ready
from quill.server.config import ServerConfig
from quill.server.hosting import HostedModel, ModelHost
from quill.server.serve import build_server


class HeldLoadServer:
    """`with HeldLoadServer(config) as server:` returns once the port answers, the models still loading;
    `server.release()` lets the load go on. The load holds before model number `held_model` (from 1), the
    ones before it loaded; the hold ignores a stopping server, as a load in the server's process does.
    On the way out the load is let go and the server stops (a stop cuts the load short)."""

    def __init__(self, config: ServerConfig, held_model: int = 1):
        self.url = f"http://{config.host}:{config.port}"
        self.hosted: list[HostedModel] = []  # the models loaded, in order, whether or not the load finished
        self.loader: threading.Thread | None = None  # the thread that loads the models
        self._holding = threading.Event()
        self._released = threading.Event()
        host = ModelHost._host

        def held(name, path, config, position, *args) -> HostedModel:
            self.loader = threading.current_thread()
            if position[0] == held_model:
                self._holding.set()
                assert self._released.wait(60), "the test never let the load go"
            hosted = host(name, path, config, position, *args)
            self.hosted.append(hosted)
            return hosted

        self._patch = mock.patch.object(ModelHost, "_host", staticmethod(held))
        self.server = build_server(config)
        self._thread = threading.Thread(target=self.server.run, name="quill-held-load")

    def release(self) -> None:
        self._released.set()

    def wait_held(self, timeout: float = 30) -> None:
        """Until the load reaches the hold (the models before it loaded)."""
        assert self._holding.wait(timeout), "the load did not reach its hold"

    def wait_ready(self) -> None:
        wait_until_ready(self.url, 60, still_starting=self._thread.is_alive)

    def wait_stopped(self, timeout: float) -> bool:
        """Whether the server stopped within `timeout` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def __enter__(self) -> "HeldLoadServer":
        self._patch.start()
        self._thread.start()
        try:
            wait_until_ready(self.url, 30, path="/health", still_starting=self._thread.is_alive)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        try:
            self.server.should_exit = True
            self._thread.join(30)
        finally:
            self._patch.stop()
