"""Times one request for the metrics and writes its log line."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator

from quill.server.engine import RequestOutput, RequestStream

from .metrics import Metrics, observe_repeated

log = logging.getLogger("quill.requests")


class RequestTracker:
    """One request's queue time, time to first token, gaps between tokens and outcome."""

    def __init__(self, metrics: Metrics, model: str, request_id: str, num_prompt_tokens: int, prompt: str | None = None):
        self.metrics, self.model, self.request_id = metrics, model, request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.prompt = prompt
        self.start = time.monotonic()
        self.last_token_time: float | None = None
        self.num_generated = 0
        self.finish_reasons: list[str] = []
        self._itl = metrics.itl.labels(model=model)  # a series looked up once, not once per token

    def observe(self, out: RequestOutput) -> None:
        now = time.monotonic()
        if out.queue_time is not None:
            self.metrics.queue_time.labels(model=self.model).observe(out.queue_time)
        new_tokens = sum(len(c.token_ids) for c in out.outputs)
        if new_tokens:
            if self.last_token_time is None:
                self.metrics.ttft.labels(model=self.model).observe(now - self.start)
            else:  # an output joining several steps' tokens spreads its gap evenly over them
                observe_repeated(self._itl, (now - self.last_token_time) / new_tokens, new_tokens)
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
