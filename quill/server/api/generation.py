"""How a parsed and checked request reaches the engine: the hosted model it names (refused while
loading, draining or overloaded), its submission, and its cancellation when the client goes away.
Routes that only describe the models (/v1/models, /info) share the refusal while loading."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import Request

from quill.server.engine import QueueFullError, RequestStream
from quill.server.hosting import HostedModel, ModelHost
from quill.server.sampling import SamplingParams

from .engine_errors import ENGINE_ERRORS, engine_error
from .errors import APIError


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


async def until_disconnected(request: Request, work: Awaitable, poll_seconds: float = 0.25):
    """Run `work`, cancelling it if the client goes away (its request is then aborted by its stream)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_seconds)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected", reason="client_disconnected")
    finally:
        if not task.done():
            task.cancel()
