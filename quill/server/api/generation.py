"""A generation request's life, written once for every dialect: the hosted model it names (refused while loading,
draining or overloaded), its prompts submitted to the engine each with a tracker for the metrics and the log
(`start`), then its answer, whole (`answer`: cancelled when the client goes away) or as server-sent events
(`event_stream`: an error after the first byte becomes the dialect's error event). However it ends, every
tracker says how and every stream is closed (which aborts an unfinished request). A dialect brings its schema and
validation, its prompt building and its answer's format. Routes that only describe the models (/v1/models, /info)
share the refusal while loading."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import StreamingResponse

from quill.server.engine import QueueFullError, RequestOutput, RequestStream
from quill.server.hosting import HostedModel, ModelHost
from quill.server.sampling import SamplingParams

from .engine_errors import ENGINE_ERRORS, checked, engine_error, final_output
from .errors import APIError
from .sse import SSE_HEADERS
from .tracking import RequestTracker


LOADING_RETRY_AFTER_SECONDS = 5  # loading takes seconds to minutes: worth asking again, not at once


def loaded_host(http: Request) -> ModelHost:
    """The hosted models; 503 with Retry-After while they are still loading (as /ready answers 503 then)."""
    host = http.app.state.host
    if host is None:
        raise APIError(503, "the models are still loading; retry shortly (GET /ready answers 200 once they are "
                            "loaded)", headers={"Retry-After": str(LOADING_RETRY_AFTER_SECONDS)}, reason="loading")
    return host


def resolve_model(http: Request, name: str | None) -> HostedModel:
    """The hosted model a request names (the default when it names none); 503 while loading or draining."""
    if http.app.state.draining:
        raise APIError(503, "the server is shutting down", reason="draining")
    host = loaded_host(http)
    hosted = host.get(name)
    if hosted is None:
        raise APIError(404, f"the model {name!r} does not exist; hosted models: {', '.join(host.models)}",
                       param="model", code="model_not_found", reason="unknown_model")
    limit = hosted.engine.config.scheduler.max_queue
    if hosted.engine.num_pending >= limit:  # cheapest check first: an overloaded server refuses at once
        raise engine_error(QueueFullError(f"the queue is full ({limit} requests waiting)"))
    return hosted


def submit(hosted: HostedModel, prompt_ids: list[int], params: SamplingParams, request_id: str) -> RequestStream:
    try:
        return hosted.engine.submit(prompt_ids, params, request_id)
    except ENGINE_ERRORS as e:
        raise engine_error(e) from None


async def until_disconnected(request: Request, work: Awaitable):
    """Run `work`, cancelling it if the client goes away (its request is then aborted by its stream). The body is
    read by then, so the connection's next message is its end: one waiting task per request, where polling
    `is_disconnected` cost the event loop a cancel scope per request four times a second (a third of its busy time with
    256 requests in flight)."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise APIError(499, "client disconnected", reason="client_disconnected")
    finally:
        for t in (task, listener):
            if not t.done():
                t.cancel()


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone away (or the response is complete: the server then says the same)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a connection that can no longer be read is gone
        return


@dataclass
class Submitted:
    """One prompt of a request, in the engine: its stream of outputs and its tracker."""

    stream: RequestStream
    tracker: RequestTracker

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Its outputs as they come, observed, engine failures raised as APIError."""
        async for out in checked(self.tracker.follow(self.stream)):
            yield out


def start(http: Request, hosted: HostedModel, prompts: list[tuple[list[int], str]], params: SamplingParams,
          request_ids: list[str]) -> list[Submitted]:
    """Submit each prompt ((ids, text): the text for the log, when prompts are logged) under its request id. A
    refusal closes those already submitted."""
    state = http.app.state
    submitted: list[Submitted] = []
    try:
        for (ids, text), request_id in zip(prompts, request_ids, strict=True):
            logged = text if state.config.log_prompts else None
            tracker = RequestTracker(state.metrics, hosted.name, request_id, len(ids), logged)
            submitted.append(Submitted(submit(hosted, ids, params, request_id), tracker))
    except APIError:
        for s in submitted:
            s.stream.close()
        raise
    return submitted


async def answer(http: Request, submitted: list[Submitted], build: Callable[[list[RequestOutput]], dict]) -> dict:
    """The whole answer: `build` of every prompt's final output, in order; cancelled if the client goes away."""

    async def whole() -> dict:
        outputs = []
        try:
            for s in submitted:
                try:
                    out = await final_output(s.stream, s.tracker.observe)
                except APIError as e:
                    s.tracker.done(e.status)
                    raise
                s.tracker.done(200)
                outputs.append(out)
        finally:
            for s in submitted:
                s.stream.close()
        return build(outputs)

    return await until_disconnected(http, whole())


def event_stream(submitted: list[Submitted], events: Callable[[int, Submitted], AsyncIterator[bytes]],
                 error_event: Callable[[APIError], bytes], tail: Callable[[], Iterable[bytes]] = tuple,
                 ) -> StreamingResponse:
    """Server-sent events: `events(i, submitted[i])` for each prompt in turn (reading its `outputs()`), then
    `tail()`. An APIError, the engine's or one `events` raises, ends the stream with `error_event` of it; a
    client that goes away is logged as 499."""

    async def body() -> AsyncIterator[bytes]:
        try:
            for i, s in enumerate(submitted):
                status = 499  # until its events end normally
                try:
                    async for chunk in events(i, s):
                        yield chunk
                    status = 200
                except APIError as e:
                    status = e.status
                    yield error_event(e)
                    return
                finally:
                    s.tracker.done(status)
            for chunk in tail():
                yield chunk
        finally:
            for s in submitted:
                s.stream.close()

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
