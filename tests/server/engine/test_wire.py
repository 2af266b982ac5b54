"""Typed messages through the engine process's pipes: encoded, framed, read back whole and of their type."""

from __future__ import annotations

import os

import pytest

from quill.server.engine.core import EngineStats
from quill.server.engine.process.messages import (DOWN, UP, AbortRequest, AddRequest, CoreInfo, Failed, MessageKind, Ready,
                                          Refusal, RefusalKind, StepOutputs, Stop)
from quill.server.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from quill.server.engine.scheduler import QueueFullError
from quill.server.engine.process.wire import FrameReader, MessageReader, MessageWriter, write_frame
from quill.server.sampling import SamplingParams


@pytest.fixture
def pipe():
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass  # the test closed it


def trip(pipe, kinds, messages: list) -> list:
    """Sent in one write, read back as the other side reads them."""
    read_end, write_end = pipe
    MessageWriter(write_end).send(messages)
    reader, back = MessageReader(read_end, kinds), []
    while len(back) < len(messages):
        back += reader.read()
    return back


def test_every_message_kind_is_an_enum_member_and_names_its_type():
    messages = [AddRequest("r", [1], SamplingParams()), AbortRequest("r"), Stop(),
                Ready(CoreInfo("cpu", "float32", 1, "x", 7)), Failed("why"), StepOutputs([], EngineStats(), 0)]
    kinds = [m.kind for m in messages]
    assert all(type(k) is MessageKind for k in kinds)
    assert kinds == [MessageKind.ADD, MessageKind.ABORT, MessageKind.STOP, MessageKind.READY, MessageKind.FAILED,
                     MessageKind.STEP]


def test_requests_go_down_as_their_types(pipe):
    params = SamplingParams(n=2, temperature=0, stop=["\n"], logit_bias={7: -1.5}, seed=2**64 - 1, logprobs=3,
                            use_beam_search=True, beam_width=2, early_stopping="never")
    sent = [AddRequest("a", [1, 2, 3], params), AbortRequest("b"), Stop()]
    back = trip(pipe, DOWN, sent)
    assert back == sent
    assert [type(m) for m in back] == [AddRequest, AbortRequest, Stop]
    assert type(back[0].params) is SamplingParams and back[0].params.logit_bias == {7: -1.5}


def test_outputs_and_refusals_come_up_as_their_types(pipe):
    first = RequestOutput("a", [CompletionOutput(0, "hé", [5, 6], [TokenLogprob(5, -0.5, [(5, -0.5), (7, -1.0)]),
                                                                   TokenLogprob(6, -0.1)], None, -0.6)],
                          False, 3, prompt_logprobs=[None, TokenLogprob(2, -2.0)], queue_time=0.25)
    last = RequestOutput("b", [CompletionOutput(1, "", [], None, "error")], True, 2, error="boom")
    refusals = [Refusal.of("c", QueueFullError("the queue is full")), Refusal.of("d", ValueError("no tokens"))]
    step = StepOutputs([first, last], EngineStats(num_running=2, cache_usage=0.5), 4, refusals)
    back, = trip(pipe, UP, [step])
    assert back == step and back.kind is MessageKind.STEP
    assert type(back.outputs[0].outputs[0].logprobs[0]) is TokenLogprob
    assert [r.kind for r in back.refusals] == [RefusalKind.QUEUE_FULL, RefusalKind.INVALID]
    errors = [r.error() for r in back.refusals]
    assert type(errors[0]) is QueueFullError and str(errors[0]) == "the queue is full"
    assert type(errors[1]) is ValueError and str(errors[1]) == "no tokens"


def test_a_message_of_the_other_direction_is_not_read_as_one_of_this(pipe):
    read_end, write_end = pipe
    MessageWriter(write_end).send([Stop()])
    with pytest.raises(Exception, match="Invalid value 3"):
        MessageReader(read_end, UP).read()


def test_frames_are_read_whole_however_the_bytes_arrive(pipe):
    read_end, write_end = pipe
    payloads = [b"x" * 10, b"", b"y" * 5000]
    for p in payloads:
        write_frame(write_end, p)
    reader = FrameReader(read_end, chunk_bytes=7)  # every frame arrives split over several reads
    assert reader.ready(0)
    got = []
    while len(got) < len(payloads):
        got += reader.read()
    assert got == payloads and not reader.ready(0)
    os.close(write_end)
    assert reader.ready(0)  # the writer's end: read tells it
    with pytest.raises(EOFError):
        reader.read()
