"""`quill serve`: uvicorn on the app, models loading behind a 503 /ready, drain on SIGTERM.

Startup: the port opens at once and /ready answers 503 while checkpoints load on a
thread; the engines start when all are loaded. A checkpoint that fails to load stops
the server with its error (exit code 2). SIGTERM: /ready and new generation requests
answer 503, in-flight requests get up to `drain_seconds` to finish, then the process
exits 0. Once no engine is alive (each lost its device, its process crashed or its loop broke),
the server exits with ENGINES_DEAD_EXIT_CODE, so that a supervisor starts a fresh one. SIGTERM
while the models load stops the loading (an engine process still loading is ended; a load in
this process is waited for up to LOADER_STOP_SECONDS), shuts down the engines already started,
starts none, and exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager

import uvicorn

from quill.models.loading.checkpoint import CheckpointError

from .api.app import attach_host, create_app
from .config import ServerConfig
from .engine import EngineStartError
from .hosting import LoadCancelled, ModelHost

log = logging.getLogger("quill.server")

ENGINES_DEAD_EXIT_CODE = 3  # every engine died while serving (2: a model failed to load)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app, drain_seconds: float):
        super().__init__(config)
        self.quill_app = app
        self.drain_seconds = drain_seconds
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_code = 0

    async def startup(self, sockets=None):
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        state = self.quill_app.state
        if sig == signal.SIGTERM and not state.draining:
            state.draining = True
            if self.loop is None:  # not serving yet: nothing to drain
                self.should_exit = True
                return
            log.info("SIGTERM: draining (up to %.0fs for in-flight requests)", self.drain_seconds)
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._drain()))
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's main loop calls this every 0.1 s: stop once no engine is left to serve (not while stopping)."""
        state = self.quill_app.state
        host = state.host
        if (counter % 5 == 0 and host is not None and host.models and not state.draining and not self.should_exit
                and not any(m.engine.is_alive for m in host.models.values())):
            reasons = "; ".join(f"{name}: {m.engine.dead_reason or 'not running'}" for name, m in host.models.items())
            log.error("no engine is alive (%s): exiting with code %d for a restart", reasons, ENGINES_DEAD_EXIT_CODE)
            self.exit_code = ENGINES_DEAD_EXIT_CODE
            self.should_exit = True
        return await super().on_tick(counter)

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_seconds
        host = self.quill_app.state.host
        while host is not None and host.num_active > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if host is not None and host.num_active:
            log.warning("drain period over with %d requests still running: they are cut off", host.num_active)
        self.should_exit = True


def _require_installed(config: ServerConfig) -> None:
    """An event loop or HTTP parser asked for by name must be importable ("auto" falls back by itself)."""
    for flag, name in (("--loop", config.loop), ("--http", config.http)):
        if name in ("uvloop", "httptools") and importlib.util.find_spec(name) is None:
            raise ValueError(f"{flag} {name}: the package {name} is not installed (pip install {name})")


# Container objects allocated, net of those freed, between two young-generation collections (Python's default is
# 700). A step's outputs for 256 streams are a few thousand containers that live until their streams are read:
# at 700 the collector walked them several times per step, then again as survivors (5 us of CPU per streamed
# token, measured; 1.3 us at 10,000). Garbage without cycles is freed at once whatever this is.
YOUNG_COLLECTION_THRESHOLD = 10_000

# How long a server that began to stop while its models load waits for the loader to wind down. An engine
# process still loading is ended at once; a load in this process (a thread engine's weights, a tokenizer)
# cannot be interrupted, and past this the process exits with it unfinished (it has started no engine).
LOADER_STOP_SECONDS = 5.0


def _tune_garbage_collector() -> None:
    """Keep the cyclic garbage collector off what startup left alive (modules, models, the app: some 200,000
    objects, which a full collection took 0.2 s to walk, several times a second under streaming load), and
    let it run less often on the young objects of streaming."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


def build_server(config: ServerConfig) -> DrainingServer:
    """The server, not yet running: its models start loading on a thread once it runs."""
    _require_installed(config)
    app = create_app(None, config)
    server: DrainingServer | None = None
    stopping = threading.Event()  # set when the server begins to stop: loading stops, no engine starts after
    attaching = threading.Lock()  # starting the loaded engines and setting `stopping` happen one after the other

    def load() -> None:
        try:
            host = ModelHost.load(config, stopping)
        except LoadCancelled as e:
            log.info("loading stopped: %s", e)
            return
        except (CheckpointError, EngineStartError, ValueError, OSError) as e:
            log.error("cannot load models: %s", e)
            server.exit_code = 2
            server.should_exit = True
            return
        with attaching:
            if not stopping.is_set():
                host.start()
                attach_host(app, host)
        if app.state.host is not host:  # loaded as the server began to stop: its engines never run
            log.info("loading stopped: the server began to stop as the models finished loading")
            host.shutdown()
            return
        _tune_garbage_collector()
        log.info("ready: %s (default %s) on http://%s:%d", ", ".join(host.models), host.default,
                 config.host, config.port)

    loader = threading.Thread(target=load, name="model-loader", daemon=True)

    @asynccontextmanager
    async def lifespan(_app):
        loader.start()
        yield
        with attaching:
            stopping.set()
        if loader.is_alive():
            await asyncio.to_thread(loader.join, LOADER_STOP_SECONDS)
            if loader.is_alive():  # it started no engine; what it was reading dies with the process
                log.warning("a model was still loading %.0fs after the server began to stop: it is cut off",
                            LOADER_STOP_SECONDS)
        if app.state.host is not None:
            app.state.host.shutdown()

    app.router.lifespan_context = lifespan
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="info", loop=config.loop,
                               http=config.http, timeout_graceful_shutdown=max(1, int(config.drain_seconds)))
    server = DrainingServer(uv_config, app, config.drain_seconds)
    return server


def serve(config: ServerConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = build_server(config)
    server.run()
    return server.exit_code


if __name__ == "__main__":
    sys.exit(serve(ServerConfig()))
