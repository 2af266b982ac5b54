"""What the API sees of one model's engine, wherever its core runs: submit, stream, abort.

`EngineFrontend` keeps each submitted request's output queue on the event loop that submitted
it and hands a step's outputs to those queues with one wake-up of each loop per step. Where the
core runs is a subclass's business: on a thread of this process (`AsyncEngine`) or in a process
of its own (`ProcessEngine`). `RequestStream` reads one request's queue, joining the outputs of
several steps that are already waiting into one, so a slow reader costs one write per turn of its
event loop rather than one per token.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable

from .core import EngineConfig, EngineStats
from .outputs import RequestOutput, merge_outputs
from .scheduler import QueueFullError


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; the model serves nothing until restarted."""


class EngineFrontend(ABC):
    """The interface routes use; subclasses run the core and call `_deliver_all` with its outputs."""

    def __init__(self, name: str, config: EngineConfig):
        self.name = name
        self.config = config
        self.dead_reason: str | None = None
        self.on_stats: Callable[[EngineStats], None] | None = None  # after every step, for metrics
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()

    # ---- what a subclass provides ----------------------------------------------------

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def shutdown(self, timeout: float = 5.0) -> None: ...

    @property
    @abstractmethod
    def is_alive(self) -> bool: ...

    @property
    @abstractmethod
    def num_pending(self) -> int:
        """Requests waiting for admission, including those not yet handed to the core."""

    @abstractmethod
    def _send_add(self, request_id: str, prompt_token_ids: list[int], params) -> None: ...

    @abstractmethod
    def _send_abort(self, request_id: str) -> None: ...

    # ---- requests ------------------------------------------------------------------

    @property
    def num_active(self) -> int:
        """Requests submitted whose streams are still open."""
        return len(self._queues)

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
        self._send_add(request_id, list(prompt_token_ids), params)
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
        self._send_abort(request_id)

    # ---- delivery (called on the thread that receives the core's outputs) ----------

    def _deliver_all(self, items: list[tuple[str, object]]) -> None:
        """Hand outputs to their requests' queues: one wake-up of each event loop per step, not one per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            target = self._queues.get(request_id)
            if target is not None:
                loop, queue = target
                by_loop.setdefault(loop, []).append((queue, item))
        for loop, batch in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_put_all, batch)

    def _fail_all(self, reason: str) -> None:
        """The core is gone: every open stream raises EngineDeadError."""
        self.dead_reason = reason
        self._deliver_all([(request_id, EngineDeadError(reason)) for request_id in list(self._queues)])

    def _report(self, stats: EngineStats) -> None:
        if self.on_stats is not None:
            self.on_stats(stats)


def _put_all(batch: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


class RequestStream:
    """The outputs of one submitted request, in order; the last one has `finished` set."""

    def __init__(self, engine: EngineFrontend, request_id: str, queue: asyncio.Queue):
        self.engine = engine
        self.request_id = request_id
        self._queue = queue
        self._held: object | None = None  # an error that waits until the outputs before it are read
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        if self._held is not None:
            out, self._held = self._held, None
        else:
            out = await self._queue.get()
        # Outputs of several steps already waiting become one: one event and one write for all of them.
        while isinstance(out, RequestOutput) and not out.finished and not self._queue.empty():
            later = self._queue.get_nowait()
            if not isinstance(later, RequestOutput):
                self._held = later
                break
            out = merge_outputs(out, later)
        if isinstance(out, BaseException):
            self._end()
            raise out
        if out.finished:
            self._end()
        return out

    def _end(self) -> None:
        self.finished = True
        self.engine._queues.pop(self.request_id, None)

    def close(self) -> None:
        """Abort the request if it has not finished (the client went away)."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)
