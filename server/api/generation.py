"""What both API dialects do between parsing a request and writing its answer.

Tokenize and check the prompt against the model's context, submit to the engine
(mapping a full queue to 429 and a dead or draining engine to 503), time the request
for the metrics, and log one line per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable

from fastapi import Request

from server.engine.async_engine import EngineDeadError, RequestStream
from server.engine.outputs import RequestOutput
from server.engine.scheduler import QueueFullError
from server.hosting import HostedModel
from server.sampling import SamplingParamError, SamplingParams

from .errors import APIError
from .metrics import Metrics

log = logging.getLogger("quill.requests")
RETRY_AFTER_SECONDS = 1


def resolve_model(http: Request, name: str | None) -> HostedModel:
    """The hosted model a request names (the default when it names none); 503 while loading or draining."""
    state = http.app.state
    if state.draining:
        raise APIError(503, "the server is shutting down", reason="draining")
    if state.host is None:
        raise APIError(503, "the models are still loading", reason="loading")
    hosted = state.host.get(name)
    if hosted is None:
        raise APIError(404, f"the model {name!r} does not exist; hosted models: {', '.join(state.host.models)}",
                       param="model", code="model_not_found", reason="unknown_model")
    limit = hosted.engine.config.scheduler.max_queue
    if hosted.engine.num_pending >= limit:  # cheapest check first: an overloaded server refuses at once
        raise APIError(429, f"the queue is full ({limit} requests waiting); retry shortly",
                       headers={"Retry-After": str(RETRY_AFTER_SECONDS)}, reason="queue_full")
    return hosted


def engine_failure(e: Exception) -> APIError:
    """An error the engine raised after admission (a stream re-raises what the step thread hit)."""
    if isinstance(e, QueueFullError):
        return APIError(429, f"{e}; retry shortly", headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                        reason="queue_full")
    if isinstance(e, EngineDeadError):
        return APIError(503, str(e), reason="engine_dead")
    return APIError(500, f"request failed during generation: {e}", reason="engine_error")


ENGINE_ERRORS = (QueueFullError, EngineDeadError, ValueError)


def build_params(**kwargs) -> SamplingParams:
    try:
        return SamplingParams(**kwargs)
    except SamplingParamError as e:
        raise APIError(400, str(e), param=e.param, reason="invalid_request") from None


def encode_prompt(hosted: HostedModel, prompt: str | list[int], param: str = "prompt") -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "the prompt is empty", param=param, reason="invalid_request")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON can carry lone surrogates (\ud800); text cannot
            raise APIError(400, f"the prompt is not valid Unicode ({e.reason} at position {e.start})",
                           param=param, reason="invalid_request") from None
        ids = hosted.tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        vocab = hosted.loaded.model.config.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param=param, reason="invalid_request")
    if not ids:
        raise APIError(400, "the prompt is empty after tokenization", param=param, reason="invalid_request")
    return ids


def check_context(hosted: HostedModel, num_prompt_tokens: int, max_tokens: int, param: str = "max_tokens") -> None:
    limit = hosted.max_model_len
    if num_prompt_tokens + max_tokens > limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens, but the request asks for "
            f"{num_prompt_tokens + max_tokens} ({num_prompt_tokens} in the prompt + {max_tokens} to generate)",
            param=param, code="context_length_exceeded", reason="context_length",
        )


def submit(hosted: HostedModel, prompt_ids: list[int], params: SamplingParams, request_id: str) -> RequestStream:
    try:
        params.check_vocab(hosted.loaded.model.config.vocab_size)
        return hosted.engine.submit(prompt_ids, params, request_id)
    except SamplingParamError as e:
        raise APIError(400, str(e), param=e.param, reason="invalid_request") from None
    except QueueFullError as e:
        raise APIError(429, f"{e}; retry shortly", headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                       reason="queue_full") from None
    except EngineDeadError as e:
        raise APIError(503, str(e), reason="engine_dead") from None


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


class RequestTracker:
    """Times one request for the metrics and writes its log line."""

    def __init__(self, metrics: Metrics, model: str, request_id: str, num_prompt_tokens: int, prompt: str | None = None):
        self.metrics, self.model, self.request_id = metrics, model, request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.prompt = prompt
        self.start = time.monotonic()
        self.last_token_time: float | None = None
        self.num_generated = 0
        self.finish_reasons: list[str] = []

    def observe(self, out: RequestOutput) -> None:
        now = time.monotonic()
        labels = dict(model=self.model)
        if out.queue_time is not None:
            self.metrics.queue_time.labels(**labels).observe(out.queue_time)
        new_tokens = sum(len(c.token_ids) for c in out.outputs)
        if new_tokens:
            if self.last_token_time is None:
                self.metrics.ttft.labels(**labels).observe(now - self.start)
            else:
                gap = (now - self.last_token_time) / new_tokens
                for _ in range(new_tokens):
                    self.metrics.itl.labels(**labels).observe(gap)
            self.last_token_time = now
            self.num_generated += new_tokens
        self.finish_reasons += [c.finish_reason for c in out.outputs if c.finish_reason]

    async def follow(self, stream: RequestStream) -> AsyncIterator[RequestOutput]:
        """The stream's outputs, observed; closing early aborts the request."""
        try:
            async for out in stream:
                self.observe(out)
                yield out
        finally:
            stream.close()

    def done(self, status: int = 200) -> None:
        labels = dict(model=self.model)
        elapsed = time.monotonic() - self.start
        self.metrics.prompt_tokens.labels(**labels).inc(self.num_prompt_tokens)
        self.metrics.generation_tokens.labels(**labels).inc(self.num_generated)
        if status == 200:
            self.metrics.e2e.labels(**labels).observe(elapsed)
            reason = self.finish_reasons[0] if self.finish_reasons else "abort"  # once per request, n outputs or not
            self.metrics.requests.labels(model=self.model, finish_reason=reason).inc()
        record = {
            "request_id": self.request_id, "model": self.model, "status": status,
            "prompt_tokens": self.num_prompt_tokens, "generated_tokens": self.num_generated,
            "latency_s": round(elapsed, 4), "finish_reason": ",".join(self.finish_reasons) or None,
        }
        if self.prompt is not None:
            record["prompt"] = self.prompt
        log.info(json.dumps(record))
