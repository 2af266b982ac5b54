"""The one place where what the engine raises or reports becomes an APIError.

Submitting can meet a full queue (429, retry shortly) or a dead or stopping engine (503); a request's
stream re-raises what the engine's step thread hit, or ends with an output carrying `error` (500),
whether read output by output (`checked`) or whole (`final_output`).
Routes then handle only APIError: answered as JSON before the first byte, as an error event after it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable

from quill.server.engine import EngineDeadError, QueueFullError, RequestOutput, RequestStream

from .errors import APIError

RETRY_AFTER_SECONDS = 1
ENGINE_ERRORS = (QueueFullError, EngineDeadError, ValueError)


def engine_error(e: Exception) -> APIError:
    if isinstance(e, QueueFullError):
        return APIError(429, f"{e}; retry shortly", headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                        reason="queue_full")
    if isinstance(e, EngineDeadError):
        return APIError(503, str(e), reason="engine_dead")
    return APIError(500, f"request failed during generation: {e}", reason="engine_error")


async def checked(outputs: AsyncGenerator[RequestOutput, None]) -> AsyncIterator[RequestOutput]:
    """The outputs, with engine failures raised as APIError (an output carrying `error` ends the request).
    However this ends, `outputs` is closed (closing a request's stream aborts the request if unfinished)."""
    try:
        async for out in outputs:
            raise_if_failed(out)
            yield out
    except ENGINE_ERRORS as e:
        raise engine_error(e) from None
    finally:
        await outputs.aclose()


async def final_output(stream: RequestStream, observe: Callable[[RequestOutput], None] | None = None) -> RequestOutput:
    """The request's whole output, merged by its stream (`RequestStream.final`), with engine failures raised
    as APIError. However this ends, the stream is closed (which aborts the request if unfinished)."""
    try:
        out = await stream.final(observe)
    except ENGINE_ERRORS as e:
        raise engine_error(e) from None
    finally:
        stream.close()
    raise_if_failed(out)
    if not out.outputs:
        raise APIError(500, "generation ended without output", reason="engine_error")
    return out


def raise_if_failed(out: RequestOutput) -> None:
    """A request the engine failed ends with `error` set and its completions' finish reason "error"."""
    if out.error or any(c.finish_reason == "error" for c in out.outputs):
        raise APIError(500, out.error or "generation failed", reason="engine_error")
