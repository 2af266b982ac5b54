"""Waiting for a server to be ready: poll its readiness probe until it answers 200.

Quill opens its port at once and answers 503 on /ready while models load, so "accepts connections"
is not "ready"; a starting process that exits meanwhile will never be ready, and the caller says
how to tell (`still_starting`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


def wait_until_ready(url: str, timeout: float = 60.0, *, path: str = "/ready", interval: float = 0.1,
                     still_starting: Callable[[], bool] = lambda: True) -> None:
    """Return once GET url+path answers 200. Raises RuntimeError as soon as `still_starting()` is false,
    and TimeoutError after `timeout` seconds."""
    probe = url.rstrip("/") + path
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not still_starting():
            raise RuntimeError(f"stopped before {probe} answered 200")
        try:
            if httpx.get(probe, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(interval)
    raise TimeoutError(f"{probe} did not answer 200 within {timeout:g} s")
