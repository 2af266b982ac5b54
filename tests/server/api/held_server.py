"""The real server (`quill serve`'s, uvicorn and the loader thread) on a thread of the test process, on a
loopback port, with its models' load held open until the test lets it go: for what clients see while
a server loads."""

from __future__ import annotations

import threading
from unittest import mock

from clients.ready import wait_until_ready
from server.config import ServerConfig
from server.hosting import ModelHost
from server.serve import build_server


class HeldLoadServer:
    """`with HeldLoadServer(config) as server:` returns once the port answers, the models still loading;
    `server.release()` lets the load go on. On the way out the load is let go and finished (a load cut
    short would leave its engines running), then the server stops."""

    def __init__(self, config: ServerConfig):
        self.url = f"http://{config.host}:{config.port}"
        self._released = threading.Event()
        load = ModelHost.load

        def held(config: ServerConfig) -> ModelHost:
            assert self._released.wait(60), "the test never let the load go"
            return load(config)

        self._patch = mock.patch.object(ModelHost, "load", staticmethod(held))
        self.server = build_server(config)
        self._thread = threading.Thread(target=self.server.run, name="quill-held-load")

    def release(self) -> None:
        self._released.set()

    def wait_ready(self) -> None:
        wait_until_ready(self.url, 60, still_starting=self._thread.is_alive)

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
            if self._thread.is_alive():
                self.wait_ready()
        finally:
            self.server.should_exit = True
            self._thread.join(30)
            self._patch.stop()
