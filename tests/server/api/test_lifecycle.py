"""A request's life as every dialect lives it (quill/server/api/generation.py): events for each prompt in turn,
the tail after the last; an error after the first byte becomes the dialect's error event and ends the stream;
every tracker says how its prompt ended (200, the error's status, 499 for a client that left) and every stream is
closed, whatever happened."""

from __future__ import annotations

import asyncio

import pytest

from quill.server.api.errors import APIError
from quill.server.api.generation import Submitted, event_stream, until_disconnected
from quill.server.engine import CompletionOutput, RequestOutput


class Stream:
    """A request's stream of outputs; remembers being closed."""

    def __init__(self, texts: list[str], fail: bool = False):
        self.texts, self.fail, self.closed = texts, fail, False

    def __aiter__(self):
        return self._outputs()

    async def _outputs(self):
        for i, text in enumerate(self.texts):
            last = i == len(self.texts) - 1 and not self.fail
            yield RequestOutput("r", [CompletionOutput(0, text, [i], finish_reason="stop" if last else None)],
                                finished=last, num_prompt_tokens=1)
        if self.fail:
            raise ValueError("the device failed")

    def close(self):
        self.closed = True


class Tracker:
    def __init__(self):
        self.status, self.seen = None, []

    def observe(self, out):
        self.seen.append(out)

    async def follow(self, stream):
        async for out in stream:
            self.observe(out)
            yield out

    def done(self, status: int = 200):
        assert self.status is None, "a tracker is told once how its request ended"
        self.status = status


def submitted(*streams: Stream) -> list[Submitted]:
    return [Submitted(stream, Tracker()) for stream in streams]


async def texts(i: int, s: Submitted):
    async for out in s.outputs():
        yield f"{i}:{out.outputs[0].text};".encode()


def error_event(error: APIError) -> bytes:
    return f"error {error.status}: {error.message}".encode()


async def read(response, stop_after: int | None = None) -> list[bytes]:
    chunks = []
    body = response.body_iterator
    async for chunk in body:
        chunks.append(chunk)
        if stop_after is not None and len(chunks) == stop_after:
            await body.aclose()  # the client goes away
            break
    return chunks


async def test_prompts_in_turn_then_the_tail():
    subs = submitted(Stream(["a", "b"]), Stream(["c"]))
    response = event_stream(subs, texts, error_event, lambda: [b"[DONE]"])
    assert await read(response) == [b"0:a;", b"0:b;", b"1:c;", b"[DONE]"]
    assert [s.tracker.status for s in subs] == [200, 200] and all(s.stream.closed for s in subs)
    assert response.media_type == "text/event-stream"


async def test_an_engine_failure_ends_the_stream_with_the_error_event_and_no_tail():
    subs = submitted(Stream(["a"], fail=True), Stream(["c"]))
    chunks = await read(event_stream(subs, texts, error_event, lambda: [b"[DONE]"]))
    assert chunks[0] == b"0:a;" and chunks[1].startswith(b"error 500: request failed during generation")
    assert len(chunks) == 2  # neither the second prompt nor the tail
    assert subs[0].tracker.status == 500 and subs[1].tracker.status is None
    assert all(s.stream.closed for s in subs)


async def test_an_error_the_dialect_raises_is_its_error_event():
    async def refusing(i, s):
        async for out in s.outputs():
            yield b"token;"
            raise APIError(500, "generation ended early (length)")

    subs = submitted(Stream(["a", "b"]))
    assert await read(event_stream(subs, refusing, error_event)) == [
        b"token;", b"error 500: generation ended early (length)"]
    assert subs[0].tracker.status == 500 and subs[0].stream.closed


async def test_a_client_that_leaves_is_logged_as_499():
    subs = submitted(Stream(["a", "b", "c"]))
    assert await read(event_stream(subs, texts, error_event), stop_after=1) == [b"0:a;"]
    assert subs[0].tracker.status == 499 and subs[0].stream.closed


class Connection:
    """An ASGI request's receive channel: its body was read; `leave()` is the client going away."""

    def __init__(self):
        self.messages: asyncio.Queue = asyncio.Queue()
        self.reads = 0

    async def receive(self):
        self.reads += 1
        return await self.messages.get()

    def leave(self):
        self.messages.put_nowait({"type": "http.disconnect"})


async def test_a_whole_answer_waits_on_the_connection_without_polling_it():
    conn = Connection()

    async def work():
        await asyncio.sleep(0.3)  # past the old 0.25 s poll
        return "answer"

    assert await until_disconnected(conn, work()) == "answer"
    assert conn.reads == 1  # one read, waiting, then cancelled with the answer


async def test_a_client_that_leaves_cancels_the_whole_answer_with_499():
    conn, cancelled = Connection(), asyncio.Event()

    async def work():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_later(0.05, conn.leave)
    with pytest.raises(APIError) as e:
        await asyncio.wait_for(until_disconnected(conn, work()), 5)
    assert e.value.status == 499
    await asyncio.wait_for(cancelled.wait(), 1)


async def test_an_error_of_the_work_is_raised_as_it_is():
    async def work():
        raise APIError(400, "bad")

    with pytest.raises(APIError) as e:
        await until_disconnected(Connection(), work())
    assert e.value.status == 400
