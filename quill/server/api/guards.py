"""Checks every request passes before any route runs: API key, body size, body deadline.

Pure ASGI middleware that reads the body itself, so an oversized body is refused while
it is still arriving, a body dribbled in slowly (slow-loris) is cut off with 408, and a
refused request never reaches a route.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body

OPEN_PATHS = {"/health", "/ready", "/metrics"}  # reachable without a key: probes and scrapers
PAGE_PREFIX = "/playground"
# LibreTranslate's clients send the key as an `api_key` field of the form or the JSON body, not as a header (never
# taken from the query string: access logs print it); its language list and page settings need none
# (quill/server/api/libretranslate)
KEY_AS_FIELD = {"/translate", "/detect"}
OPEN_GETS = {"/languages", "/frontend/settings"}


def is_open(method: str, path: str) -> bool:
    """Paths reachable without a key: the probes and the scrape, and GETs of the playground page and of
    the index pointing at it (static, and a browser cannot send a bearer token when it loads a page; the
    page sends the key with each API call)."""
    if path in OPEN_PATHS or (path in OPEN_GETS and method in ("GET", "HEAD")):
        return True
    is_page = path in ("/", PAGE_PREFIX) or path.startswith(PAGE_PREFIX + "/")
    return is_page and method in ("GET", "HEAD")


def field_key(body: bytes, content_type: bytes) -> str:
    """The `api_key` a LibreTranslate client sent: a JSON body's field, or a form's."""
    if content_type.startswith(b"application/json"):
        try:
            value = json.loads(body).get("api_key")
        except (ValueError, AttributeError):
            return ""
        return value if isinstance(value, str) else ""
    if not content_type.startswith(b"application/x-www-form-urlencoded"):
        return ""
    return parse_qs(body.decode("latin-1")).get("api_key", [""])[0]


def key_matches(given: str, keys: list[str]) -> bool:
    """Constant-time against every key, so timing says nothing about which key is close."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given.encode(), key.encode())
    return matched


class RequestGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, api_keys: list[str], on_reject=None,
                 body_timeout: float = 30.0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout  # a body still arriving after this long is a slow-loris: 408
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
        key_in_body = False  # a LibreTranslate request with no bearer token: its key is checked in its body
        if self.api_keys and not is_open(scope["method"], path):
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not key_matches(token.strip(), self.api_keys):
                if path not in KEY_AS_FIELD or scope["method"] != "POST":
                    return await self._reject(scope, send, 401, "missing or invalid API key",
                                              {"WWW-Authenticate": "Bearer"})
                key_in_body = True
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await self._reject(scope, send, 413, f"request body over the limit of {self.max_body_bytes} bytes")
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        # Read the whole body here, under a size cap and a deadline, then hand it to the app in one piece.
        body = bytearray()
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                return await self._reject(scope, send, 408, f"request body not received within {self.body_timeout:g} s")
            if message["type"] == "http.disconnect":
                return  # the client left before sending its request: nothing to answer
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                return await self._reject(scope, send, 413, f"request body over the limit of {self.max_body_bytes} bytes")
            if not message.get("more_body", False):
                break
        if key_in_body and not key_matches(field_key(bytes(body), headers.get(b"content-type", b"")), self.api_keys):
            return await self._reject(scope, send, 401, "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # afterwards: only a disconnect can come

        await self.app(scope, replay, send)


async def _drain_receive() -> Message:
    return {"type": "http.disconnect"}
