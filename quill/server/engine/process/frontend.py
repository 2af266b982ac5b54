"""What the API sees of one model's engine, wherever its core runs: submit, stream, abort.

`EngineFrontend` hands a step's outputs to the streams of their requests with one wake-up of each
event loop per step; a stream belongs to the event loop that submitted its request. Where the core
runs is a subclass's business: on a thread of this process (`AsyncEngine`) or in a process of its
own (`ProcessEngine`). A `RequestStream` keeps the outputs delivered and not yet read in a plain
list and joins those of several steps into one (`merge_outputs`), so a slow reader costs one write per
turn of its event loop rather than one per token, and a step's output costs its stream one append.
A route that answers whole asks the stream for its `final` output, merged by the same function.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable

from ..core import EngineConfig, EngineStats
from ..outputs import RequestOutput, merge_outputs
from ..scheduler import QueueFullError


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; the model serves nothing until restarted."""


class EngineFrontend(ABC):
    """The interface routes use; subclasses run the core and call `_deliver_all` with its outputs."""

    def __init__(self, name: str, config: EngineConfig):
        self.name = name
        self.config = config
        self.dead_reason: str | None = None
        self.on_stats: Callable[[EngineStats], None] | None = None  # after every step, for metrics
        self._streams: dict[str, RequestStream] = {}  # submitted requests whose streams are open
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

    @property
    @abstractmethod
    def cache_bytes(self) -> int:
        """What the model's cache reserved on its device."""

    @property
    @abstractmethod
    def num_kv_blocks(self) -> int | None:
        """The K,V blocks its sequences can use; None for a model that keeps none (or before it loaded)."""

    @abstractmethod
    def describe_cache(self) -> str:
        """The cache in words, for the load log: what it holds, in what blocks or slots."""

    @abstractmethod
    def _send_add(self, request_id: str, prompt_token_ids: list[int], params) -> None: ...

    @abstractmethod
    def _send_abort(self, request_id: str) -> None: ...

    # ---- requests ------------------------------------------------------------------

    @property
    def num_active(self) -> int:
        """Requests submitted whose streams are still open."""
        return len(self._streams)

    def submit(self, prompt_token_ids: list[int], params, request_id: str | None = None) -> "RequestStream":
        """Queue a request now (raising at once if the queue is full or the engine is dead); read its outputs
        by iterating the returned stream. Closing the stream before the end aborts the request."""
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or f"engine {self.name} is not running")
        if self.num_pending >= self.config.scheduler.max_queue:
            raise QueueFullError(f"the queue is full ({self.config.scheduler.max_queue} requests waiting)")
        request_id = request_id or f"{self.name}-{next(self._ids)}"
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        self._streams[request_id] = stream
        self._send_add(request_id, list(prompt_token_ids), params)
        return stream

    async def generate(self, prompt_token_ids: list[int], params, request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Submit and yield outputs as they come; leaving early aborts the request."""
        stream = self.submit(prompt_token_ids, params, request_id)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._send_abort(request_id)

    # ---- delivery (called on the thread that receives the core's outputs) ----------

    def _deliver_all(self, items: list[tuple[str, object]]) -> None:
        """Hand outputs to their requests' streams: one wake-up of each event loop per step, not one per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            stream = self._streams.get(request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream, item))
        for loop, batch in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_push_all, batch)

    def _fail_all(self, reason: str) -> None:
        """The core is gone: every open stream raises EngineDeadError."""
        self.dead_reason = reason
        self._deliver_all([(request_id, EngineDeadError(reason)) for request_id in list(self._streams)])

    def _report(self, stats: EngineStats) -> None:
        if self.on_stats is not None:
            self.on_stats(stats)


def _push_all(batch: list[tuple["RequestStream", object]]) -> None:
    for stream, item in batch:
        stream._push(item)


class RequestStream:
    """The outputs of one submitted request, in order; the last one has `finished` set."""

    def __init__(self, engine: EngineFrontend, request_id: str, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.request_id = request_id
        self.loop = loop  # the event loop that reads this stream; outputs are pushed on it
        self._pending: list = []  # delivered, not yet read: RequestOutputs, an error perhaps last
        self._waiter: asyncio.Future | None = None  # set while the reader waits for a delivery
        self.finished = False

    def _push(self, item: object) -> None:
        self._pending.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        while not self._pending:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        pending = self._pending
        if isinstance(pending[0], BaseException):  # raised once the outputs before it are read
            self._end()
            raise pending.pop(0)
        # Outputs of several steps already waiting become one: one event and one write for all of them.
        count = 1
        while count < len(pending) and not isinstance(pending[count], BaseException):
            count += 1
        out = merge_outputs(pending[:count])
        del pending[:count]
        if out.finished:
            self._end()
        return out

    async def final(self, observe: Callable[[RequestOutput], None] | None = None) -> RequestOutput:
        """The whole output of the request: every output read to the end (the one that is `finished`) and
        merged; raises what the stream raises. `observe` sees each output as it is read (metrics time them)."""
        if self.finished:
            raise RuntimeError(f"the stream of {self.request_id} was already read to its end")
        outputs = []
        async for out in self:
            if observe is not None:
                observe(out)
            outputs.append(out)
        return merge_outputs(outputs)

    def _end(self) -> None:
        self.finished = True
        self.engine._streams.pop(self.request_id, None)

    def close(self) -> None:
        """Abort the request if it has not finished (the client went away)."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)
