"""Drives a running server with a workload and times every streamed chunk.

One asyncio loop, one HTTP connection per request in flight. Requests leave at their
`send_at` (Poisson arrivals) or as soon as one of `concurrency` slots frees (or both).
No retries: a 429 or 503 is what a load test is there to see, so it is recorded as such.
At the duration cap, requests still running are cancelled and the rest are never sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
from tqdm import tqdm

from quill.clients.request import completion_body

from .client_pool import ClientPool
from .workload import BenchRequest


@dataclass
class RequestResult:
    index: int
    model: str
    strategy: str
    answers_at_end: bool  # beam search: one chunk at the end, no first-token or inter-token times
    status: str  # HTTP status ("200", "429", ...), "connection", "stream_error", "bad_response" or "cancelled"
    start: float  # seconds after the run started
    latency: float | None = None  # end to end
    ttft: float | None = None  # time to the first chunk with text (streaming only)
    chunk_gaps: list[float] = field(default_factory=list)  # between consecutive text chunks of the same choice
    prompt_tokens: int = 0
    completion_tokens: int = 0  # all choices, as the server's usage counts them
    num_choices: int = 1
    error: str | None = None
    texts: dict[int, str] = field(default_factory=dict)  # each choice's text, as it arrived
    encoder_decoder: bool = False
    source_lang: str | None = None  # the languages the request carried (None: not sent)
    target_lang: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.status == "200"

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (latency - ttft) / (tokens per choice - 1)."""
        per_choice = self.completion_tokens / max(1, self.num_choices)
        if self.ttft is None or self.latency is None or per_choice < 2 or self.answers_at_end:
            return None
        return (self.latency - self.ttft) / (per_choice - 1)


@dataclass
class RunResult:
    concurrency: int | None
    rate: float | None
    elapsed: float  # seconds from the first send to the last answer (or the cap)
    results: list[RequestResult]
    num_not_sent: int  # left when the duration cap was reached
    hit_duration_cap: bool


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except (ValueError, AttributeError):
        return response.text[:200]


async def _send_streamed(http: ClientPool, body: dict, result: RequestResult, t0: float) -> None:
    last_chunk: dict[int, float] = {}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code >= 400:
            await response.aread()
            result.status, result.error = str(response.status_code), _error_message(response)
            return
        async for line in response.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                result.status = "200"
                break
            payload = json.loads(data)
            if "error" in payload:
                result.status, result.error = "stream_error", str(payload["error"].get("message"))
                break
            if payload.get("usage"):
                result.prompt_tokens = payload["usage"]["prompt_tokens"]
                result.completion_tokens = payload["usage"]["completion_tokens"]
            for choice in payload.get("choices", []):
                if not choice.get("text"):
                    continue
                index = choice.get("index", 0)
                result.texts[index] = result.texts.get(index, "") + choice["text"]
                if result.ttft is None:
                    result.ttft = now - t0
                if index in last_chunk:
                    result.chunk_gaps.append(now - last_chunk[index])
                last_chunk[index] = now
        else:
            result.status, result.error = "stream_error", "the stream ended before [DONE]"


async def _send_plain(http: ClientPool, body: dict, result: RequestResult) -> None:
    response = await http.post("/v1/completions", json=body)
    if response.status_code >= 400:
        result.status, result.error = str(response.status_code), _error_message(response)
        return
    answer = response.json()
    usage = answer.get("usage") or {}
    result.texts = {choice.get("index", 0): choice.get("text", "") for choice in answer.get("choices", [])}
    result.status = "200"
    result.prompt_tokens, result.completion_tokens = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)


async def send(http: ClientPool, request: BenchRequest, stream: bool, ignore_eos: bool, run_start: float,
               into: dict[int, RequestResult]) -> RequestResult:
    """One request, timed from the moment it leaves; its result is in `into` from that moment on."""
    t0 = time.perf_counter()
    s = request.strategy
    result = RequestResult(request.index, request.model, s.name, s.answers_at_end, "connection", t0 - run_start,
                           num_choices=s.options.get("n", 1), encoder_decoder=request.encoder_decoder)
    into[request.index] = result
    body = completion_body(request.prompt, stream=stream, **request.options(ignore_eos))
    result.source_lang, result.target_lang = body.get("source_lang"), body.get("target_lang")  # as sent
    try:
        if stream:
            await _send_streamed(http, body, result, t0)
        else:
            await _send_plain(http, body, result)
    except httpx.HTTPError as e:
        result.status, result.error = "connection", f"{type(e).__name__}: {e}"
    except (ValueError, KeyError, AttributeError) as e:  # a body that is not the API's JSON
        result.status, result.error = "bad_response", f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:
        result.status, result.error = "cancelled", "the duration cap was reached"
        raise
    result.latency = time.perf_counter() - t0
    return result


def http_client(url: str, api_key: str | None, timeout: float) -> ClientPool:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return ClientPool(
        base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


async def run_workload(
    url: str, requests: list[BenchRequest], *, concurrency: int | None, rate: float | None, stream: bool,
    ignore_eos: bool, duration: float, api_key: str | None = None, progress: bool = True, label: str = "bench",
) -> RunResult:
    """Send `requests` (their `send_at` already drawn from `rate`); at most `concurrency` in flight if given."""
    slots = asyncio.Semaphore(concurrency) if concurrency else None
    done: dict[int, RequestResult] = {}
    bar = tqdm(total=len(requests), unit="req", desc=label, disable=not progress, leave=False, dynamic_ncols=True)
    errors = 0
    async with http_client(url, api_key, timeout=duration + 60) as http:
        start = time.perf_counter()

        async def one(request: BenchRequest) -> None:
            nonlocal errors
            delay = start + request.send_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None:
                result = await send(http, request, stream, ignore_eos, start, done)
            else:
                async with slots:
                    result = await send(http, request, stream, ignore_eos, start, done)
            errors += not result.is_ok
            bar.update(1)
            bar.set_postfix(errors=errors, refresh=False)

        tasks = [asyncio.create_task(one(r)) for r in requests]
        _, pending = await asyncio.wait(tasks, timeout=duration)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.perf_counter() - start
    bar.close()
    results = [done[i] for i in sorted(done)]
    return RunResult(concurrency, rate, elapsed, results, len(requests) - len(results), bool(pending))
