"""The frontend's streams without a model: delivery from another thread, joined outputs, errors in order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from quill.server.engine.core import EngineConfig
from quill.server.engine.process.frontend import EngineDeadError, EngineFrontend
from quill.server.engine.outputs import CompletionOutput, RequestOutput


class RecordingFrontend(EngineFrontend):
    """Sends go to a list; the test plays the core by calling `_deliver_all`."""

    def __init__(self):
        super().__init__("m", EngineConfig())
        self.sent: list[tuple] = []

    def start(self) -> None: ...

    def shutdown(self, timeout: float = 5.0) -> None: ...

    @property
    def is_alive(self) -> bool:
        return True

    @property
    def num_pending(self) -> int:
        return 0

    @property
    def cache_bytes(self) -> int:
        return 0

    @property
    def num_kv_blocks(self) -> int | None:
        return None

    def describe_cache(self) -> str:
        return "none"

    def _send_add(self, request_id, prompt_token_ids, params) -> None:
        self.sent.append(("add", request_id))

    def _send_abort(self, request_id) -> None:
        self.sent.append(("abort", request_id))


def output(request_id: str, text: str, token_id: int, finished: bool = False) -> RequestOutput:
    completion = CompletionOutput(0, text, [token_id], finish_reason="length" if finished else None)
    return RequestOutput(request_id, [completion], finished, num_prompt_tokens=2)


def deliver_from_thread(engine: EngineFrontend, items: list) -> None:
    thread = threading.Thread(target=engine._deliver_all, args=(items,))
    thread.start()
    thread.join()


def test_a_waiting_reader_is_woken_by_a_delivery_from_another_thread():
    engine = RecordingFrontend()

    async def main():
        stream = engine.submit([1, 2], None, "r")
        reader = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the reader now waits
        deliver_from_thread(engine, [("r", output("r", "a", 5, finished=True))])
        return await asyncio.wait_for(reader, 5), stream

    out, stream = asyncio.run(main())
    assert out.outputs[0].text == "a" and out.finished and stream.finished
    assert engine.num_active == 0 and engine.sent == [("add", "r")]


def test_outputs_waiting_are_read_as_one_then_the_error_after_them():
    engine = RecordingFrontend()

    async def main():
        stream = engine.submit([1, 2], None, "r")
        deliver_from_thread(engine, [("r", output("r", "a", 5))])
        deliver_from_thread(engine, [("r", output("r", "b", 6))])
        engine._fail_all("gone")
        await asyncio.sleep(0)  # the pushes, scheduled before this task yields, run first
        first = await stream.__anext__()
        with pytest.raises(EngineDeadError, match="gone"):
            await stream.__anext__()
        return first, stream

    first, stream = asyncio.run(main())
    assert (first.outputs[0].text, first.outputs[0].token_ids, first.finished) == ("ab", [5, 6], False)
    assert stream.finished and engine.num_active == 0


def test_closing_an_unfinished_stream_aborts_its_request_and_drops_later_outputs():
    engine = RecordingFrontend()

    async def main():
        stream = engine.submit([1, 2], None, "r")
        stream.close()
        engine._deliver_all([("r", output("r", "a", 5))])  # the core's step was already under way
        await asyncio.sleep(0)
        return stream

    stream = asyncio.run(main())
    assert engine.sent == [("add", "r"), ("abort", "r")]
    assert stream._pending == [] and engine.num_active == 0


def test_the_final_output_merges_every_output_and_each_is_observed_as_it_is_read():
    engine = RecordingFrontend()
    observed = []

    async def main():
        stream = engine.submit([1, 2], None, "r")
        final = asyncio.ensure_future(stream.final(observed.append))
        for text, token_id, finished in (("a", 5, False), ("b", 6, False), ("c", 7, True)):
            engine._deliver_all([("r", output("r", text, token_id, finished))])
            await asyncio.sleep(0)  # the push
            await asyncio.sleep(0)  # the reader reads it
        return await asyncio.wait_for(final, 5), stream

    out, stream = asyncio.run(main())
    assert (out.outputs[0].text, out.outputs[0].token_ids, out.finished) == ("abc", [5, 6, 7], True)
    assert [o.outputs[0].text for o in observed] == ["a", "b", "c"]
    assert stream.finished and engine.num_active == 0
    with pytest.raises(RuntimeError, match="already read"):
        asyncio.run(stream.final())


def test_the_final_output_of_a_refused_request_raises_its_refusal():
    engine = RecordingFrontend()

    async def main():
        stream = engine.submit([1, 2], None, "r")
        engine._deliver_all([("r", ValueError("the prompt has no tokens"))])
        return await stream.final()

    with pytest.raises(ValueError, match="no tokens"):
        asyncio.run(main())
