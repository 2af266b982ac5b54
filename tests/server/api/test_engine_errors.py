"""Engine failures become APIError in one place: at submission, and in a request's stream."""

from __future__ import annotations

import pytest

from quill.server.api.engine_errors import checked, engine_error
from quill.server.api.errors import APIError
from quill.server.engine.process.frontend import EngineDeadError
from quill.server.engine.outputs import CompletionOutput, RequestOutput
from quill.server.engine.scheduler import QueueFullError


def test_each_failure_has_its_status():
    full = engine_error(QueueFullError("the queue is full (3 requests waiting)"))
    assert (full.status, full.headers, full.reason) == (429, {"Retry-After": "1"}, "queue_full")
    assert full.message == "the queue is full (3 requests waiting); retry shortly"
    dead = engine_error(EngineDeadError("engine loop stopped"))
    assert (dead.status, dead.message, dead.reason) == (503, "engine loop stopped", "engine_dead")
    other = engine_error(ValueError("boom"))
    assert (other.status, other.reason) == (500, "engine_error") and "boom" in other.message


class Outputs:
    """A request's outputs as the tracker yields them; remembers being closed."""

    def __init__(self, outputs, fail: Exception | None = None):
        self.outputs, self.fail, self.closed = outputs, fail, False

    async def play(self):
        try:
            for out in self.outputs:
                yield out
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


def output(text: str, error: str | None = None) -> RequestOutput:
    return RequestOutput("r", [CompletionOutput(0, text, [1])], error is not None, 2, error=error)


async def collect(outputs: Outputs) -> list[str]:
    return [out.outputs[0].text async for out in checked(outputs.play())]


async def test_outputs_pass_through_and_the_stream_is_closed():
    outputs = Outputs([output("a"), output("b")])
    assert await collect(outputs) == ["a", "b"] and outputs.closed


@pytest.mark.parametrize("fail, status", [(EngineDeadError("engine loop stopped"), 503), (ValueError("boom"), 500)])
async def test_a_failure_raised_mid_stream_is_an_api_error(fail, status):
    outputs = Outputs([output("a")], fail)
    with pytest.raises(APIError) as error:
        await collect(outputs)
    assert error.value.status == status and outputs.closed


async def test_an_output_carrying_an_error_ends_the_request_with_500():
    outputs = Outputs([output("a"), output("", error="internal error while generating: boom"), output("never")])
    seen = []
    with pytest.raises(APIError) as error:
        async for out in checked(outputs.play()):
            seen.append(out.outputs[0].text)
    assert seen == ["a"] and error.value.status == 500 and error.value.message.endswith("boom")
    assert outputs.closed


async def test_leaving_early_closes_the_stream():
    outputs = Outputs([output("a"), output("b")])
    stream = checked(outputs.play())
    async for _ in stream:
        break
    await stream.aclose()
    assert outputs.closed


async def test_a_completion_the_engine_failed_ends_the_stream_even_without_an_error_message():
    failed = RequestOutput("r", [CompletionOutput(0, "", [], None, "error")], True, 1)
    outputs = Outputs([output("a"), failed])
    seen = []
    with pytest.raises(APIError) as raised:
        async for out in checked(outputs.play()):
            seen.append(out)
    assert len(seen) == 1 and raised.value.status == 500 and raised.value.reason == "engine_error"
    assert outputs.closed


def test_finish_reasons_are_only_those_the_engine_emits():
    """An aborted request gets no further output, so no route has an "abort" reason to check for."""
    import msgspec

    encoded = msgspec.msgpack.encode(CompletionOutput(0, "", [], None, "stop"))
    assert msgspec.msgpack.decode(encoded, type=CompletionOutput).finish_reason == "stop"
    bogus = encoded.replace(b"stop", b"xxxx")
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(bogus, type=CompletionOutput)
