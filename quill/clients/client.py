"""`Client` and `AsyncClient`: Quill's completions API over httpx.

Errors become `QuillError` (status, message, the server's error type). Calls are retried
with backoff on 429 and 503, honouring Retry-After; a stream is retried only until its
first bytes arrive. The API key comes from the argument or QUILL_API_KEY.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator

import httpx

from .errors import QuillConnectionError, QuillError, error_from_response
from .request import RETRY_STATUSES, completion_body, retry_delay
from .types import Completion, ModelInfo

DEFAULT_URL = "http://127.0.0.1:8000"


def _headers(api_key: str | None) -> dict[str, str]:
    key = api_key or os.environ.get("QUILL_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        raise error_from_response(response.status_code, body)


DONE = object()  # the stream's end marker


def _sse_delta(line: str):
    """One SSE line -> its text delta ("" for none), or DONE; an error event raises."""
    if not line.startswith("data: "):
        return ""
    data = line[len("data: "):]
    if data == "[DONE]":
        return DONE
    payload = json.loads(data)
    if "error" in payload:
        raise error_from_response(500, payload)
    return "".join(c.get("text", "") for c in payload.get("choices", []) if c.get("index", 0) == 0)


class _Base:
    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = 120.0,
                 max_retries: int = 3, backoff: float = 0.5):
        self.base_url = base_url.rstrip("/")
        self.headers = _headers(api_key)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff

    def _should_retry(self, response: httpx.Response, attempt: int) -> float | None:
        if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
            return retry_delay(attempt, response.headers.get("Retry-After"), self.backoff)
        return None


class Client(_Base):
    """Synchronous client. `with Client(url) as c: c.complete("ROMEO:", max_tokens=20).text`"""

    def __init__(self, base_url: str = DEFAULT_URL, **kwargs):
        super().__init__(base_url, **kwargs)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=self.timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                raise QuillConnectionError(f"cannot reach {self.base_url}: {e}") from None
            delay = self._should_retry(response, attempt)
            if delay is None:
                _raise_for(response)
                return response
            time.sleep(delay)
        raise AssertionError("unreachable")

    def complete(self, prompt, **options) -> Completion:
        """Every decoding option of the API as a keyword (beam search: `beam_width=`)."""
        return Completion.from_json(self._send("POST", "/v1/completions", json=completion_body(prompt, **options)).json())

    def stream(self, prompt, **options) -> Iterator[str]:
        """Text deltas of the first choice as they arrive."""
        body = completion_body(prompt, stream=True, **options)
        for attempt in range(self.max_retries + 1):
            try:
                with self._http.stream("POST", "/v1/completions", json=body) as response:
                    delay = self._should_retry(response, attempt)
                    if delay is None:
                        if response.status_code >= 400:
                            response.read()
                            _raise_for(response)
                        for line in response.iter_lines():
                            delta = _sse_delta(line)
                            if delta is DONE:
                                return
                            if delta:
                                yield delta
                        raise QuillConnectionError("the stream ended before [DONE]")
            except httpx.TransportError as e:
                raise QuillConnectionError(f"stream from {self.base_url} broke: {e}") from None
            time.sleep(delay)

    def models(self) -> list[ModelInfo]:
        data = self._send("GET", "/v1/models").json()["data"]
        return [ModelInfo.from_json(m) for m in data]

    def health(self) -> bool:
        try:
            return self._http.get("/health").status_code == 200
        except httpx.TransportError:
            return False


class AsyncClient(_Base):
    """Asynchronous client: `async with AsyncClient(url) as c: async for t in c.stream("ROMEO:"): ...`"""

    def __init__(self, base_url: str = DEFAULT_URL, **kwargs):
        super().__init__(base_url, **kwargs)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=self.timeout)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                raise QuillConnectionError(f"cannot reach {self.base_url}: {e}") from None
            delay = self._should_retry(response, attempt)
            if delay is None:
                _raise_for(response)
                return response
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def complete(self, prompt, **options) -> Completion:
        response = await self._send("POST", "/v1/completions", json=completion_body(prompt, **options))
        return Completion.from_json(response.json())

    async def stream(self, prompt, **options) -> AsyncIterator[str]:
        body = completion_body(prompt, stream=True, **options)
        for attempt in range(self.max_retries + 1):
            try:
                async with self._http.stream("POST", "/v1/completions", json=body) as response:
                    delay = self._should_retry(response, attempt)
                    if delay is None:
                        if response.status_code >= 400:
                            await response.aread()
                            _raise_for(response)
                        async for line in response.aiter_lines():
                            delta = _sse_delta(line)
                            if delta is DONE:
                                return
                            if delta:
                                yield delta
                        raise QuillConnectionError("the stream ended before [DONE]")
            except httpx.TransportError as e:
                raise QuillConnectionError(f"stream from {self.base_url} broke: {e}") from None
            await asyncio.sleep(delay)

    async def models(self) -> list[ModelInfo]:
        data = (await self._send("GET", "/v1/models")).json()["data"]
        return [ModelInfo.from_json(m) for m in data]

    async def health(self) -> bool:
        try:
            return (await self._http.get("/health")).status_code == 200
        except httpx.TransportError:
            return False
