"""Server-Sent Events framing."""

from __future__ import annotations

import json

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering of streams

# json.dumps builds a new encoder whenever it is given options; one made once serves every event.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_event(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else _ENCODE(payload)
    return f"data: {data}\n\n".encode()
