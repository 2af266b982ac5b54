"""Checks every request passes before any route runs: body size and API key.

Pure ASGI middleware, so an oversized body is refused while it is still arriving,
and a refused request never reaches a route.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body

OPEN_PATHS = {"/health", "/ready", "/metrics"}  # reachable without a key: probes and scrapers


def key_matches(given: str, keys: list[str]) -> bool:
    """Constant-time against every key, so timing says nothing about which key is close."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given.encode(), key.encode())
    return matched


class BodyTooLarge(Exception):
    pass


class RequestGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, api_keys: list[str], on_reject=None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_keys = api_keys
        self.on_reject = on_reject  # (path, status) for metrics

    async def _reject(self, scope: Scope, send: Send, status: int, message: str, headers=None) -> None:
        if self.on_reject is not None:
            self.on_reject(scope["path"], status)
        response = JSONResponse(error_body(scope["path"], status, message), status_code=status, headers=headers)
        await response(scope, _drain_receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = dict(scope["headers"])
        if self.api_keys and path not in OPEN_PATHS:
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not key_matches(token.strip(), self.api_keys):
                return await self._reject(scope, send, 401, "missing or invalid API key",
                                          {"WWW-Authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await self._reject(scope, send, 413, f"request body over the limit of {self.max_body_bytes} bytes")

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge()
            return message

        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(scope, send, 413, f"request body over the limit of {self.max_body_bytes} bytes")


async def _drain_receive() -> Message:
    return {"type": "http.disconnect"}
