"""One engine loop per hosted model, on a thread of its own, with an asyncio face.

The step thread owns the `EngineCore`; the event loop only drops requests and aborts
into an inbox and reads outputs from per-request queues, so HTTP handling never waits
on a forward pass (torch releases the GIL while it computes).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator

from models.checkpoint import LoadedModel

from .core import EngineConfig, EngineCore
from .cpu_threads import StepThreads
from .outputs import CompletionOutput, RequestOutput
from .scheduler import QueueFullError

log = logging.getLogger("quill.engine")


class EngineDeadError(RuntimeError):
    """The step thread has stopped; the model serves nothing until restarted."""


class AsyncEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, name: str | None = None,
                 threads: int | str | None = None):
        """`threads`: torch CPU threads for the steps: a number, "auto" (measured and re-picked as load
        changes; a seeded request's log-probabilities may then differ in their last bits between thread
        counts), or None (torch's choice)."""
        self.name = name or loaded.name
        self.core = EngineCore(loaded, config)
        self.threads = None
        if loaded.device.type == "cpu" and threads is not None:
            self.threads = StepThreads(None if threads == "auto" else threads)
        self.config = self.core.config
        self._inbox: deque[tuple] = deque()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self.dead_reason: str | None = None
        self.on_step = None  # optional callback(core) after every step, for metrics

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead_reason is None

    @property
    def num_active(self) -> int:
        """Requests submitted whose streams are still open."""
        return len(self._queues)

    @property
    def num_pending(self) -> int:
        """Requests waiting for admission, including those still in the inbox."""
        return len(self.core.scheduler.waiting) + sum(1 for item in list(self._inbox) if item[0] == "add")

    # ---- requests ------------------------------------------------------------------

    def submit(self, prompt_token_ids: list[int], params, request_id: str | None = None) -> "RequestStream":
        """Queue a request now (raising at once if the queue is full or the engine is dead); read its outputs
        by iterating the returned stream. Closing the stream before the end aborts the request."""
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or f"engine {self.name} is not running")
        if self.num_pending >= self.config.scheduler.max_queue:
            raise QueueFullError(f"the queue is full ({self.config.scheduler.max_queue} requests waiting)")
        request_id = request_id or f"{self.name}-{next(self._ids)}"
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        self._inbox.append(("add", request_id, list(prompt_token_ids), params))
        self._wake.set()
        return RequestStream(self, request_id, queue)

    async def generate(self, prompt_token_ids: list[int], params, request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Submit and yield outputs as they come; leaving early aborts the request."""
        stream = self.submit(prompt_token_ids, params, request_id)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self._inbox.append(("abort", request_id))
        self._wake.set()

    # ---- the step thread -----------------------------------------------------------

    def _deliver(self, request_id: str, item) -> None:
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, object]]) -> None:
        """Hand outputs to their requests' queues: one wake-up of each event loop per step, not one per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            target = self._queues.get(request_id)
            if target is not None:
                loop, queue = target
                by_loop.setdefault(loop, []).append((queue, item))
        for loop, batch in by_loop.items():
            loop.call_soon_threadsafe(_put_all, batch)

    def _drain_inbox(self) -> None:
        while self._inbox:
            item = self._inbox.popleft()
            if item[0] == "abort":
                self.core.abort(item[1])
                continue
            _, request_id, prompt, params = item
            if request_id not in self._queues:  # its client left before it was queued
                continue
            try:
                self.core.add_request(request_id, prompt, params)
            except (QueueFullError, ValueError) as e:
                self._deliver(request_id, e)

    def _fail_running(self, message: str) -> None:
        """A step raised: fail the requests it was running, free their cache, keep serving the rest.
        A step can die halfway through its bookkeeping, so the cache is then rebuilt from nothing
        (waiting requests hold no cache)."""
        for group in list(self.core.scheduler.running):
            self.core.abort(group.request_id)
            outs = [CompletionOutput(i, "", [], None, "error") for i in range(group.params.n)]
            self._deliver(
                group.request_id,
                RequestOutput(group.request_id, outs, True, len(group.prompt_token_ids), error=message),
            )
        self.core.cache.reset()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_inbox()
                if not self.core.has_work():
                    if self.on_step is not None:  # aborts may have emptied it: report the idle state
                        self.on_step(self.core)
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                try:
                    if self.threads is not None:
                        self.threads.before_step()
                    outputs = self.core.step()
                    if self.threads is not None:
                        self.threads.after_step(self.core.last_step)
                except Exception as e:  # a fault in the model must not take the server down
                    log.exception("engine step failed")
                    self._fail_running(f"internal error while generating: {type(e).__name__}: {e}")
                    continue
                self._deliver_all([(out.request_id, out) for out in outputs])
                if self.on_step is not None:
                    self.on_step(self.core)
        except BaseException as e:  # the loop itself broke: report it, fail everyone waiting
            self.dead_reason = f"engine loop stopped: {type(e).__name__}: {e}"
            log.exception("engine loop stopped")
            for request_id in list(self._queues):
                self._deliver(request_id, EngineDeadError(self.dead_reason))


def _put_all(batch: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


class RequestStream:
    """The outputs of one submitted request, in order; the last one has `finished` set."""

    def __init__(self, engine: AsyncEngine, request_id: str, queue: asyncio.Queue):
        self.engine = engine
        self.request_id = request_id
        self._queue = queue
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self._queue.get()
        if isinstance(out, BaseException):
            self.finished = True
            self.engine._queues.pop(self.request_id, None)
            raise out
        if out.finished:
            self.finished = True
            self.engine._queues.pop(self.request_id, None)
        return out

    def close(self) -> None:
        """Abort the request if it has not finished (the client went away)."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)
