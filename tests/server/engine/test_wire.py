"""Step outputs through the engine process's pipe: encoded, framed, read back whole."""

from __future__ import annotations

import copy
import os
import pickle

import pytest

from server.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob, merge_outputs
from server.engine.scheduler import QueueFullError
from server.engine.wire import FrameReader, deliveries, encode, join, write_frame


def trip(outputs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Encoded, pickled as the pipe does, and read back one output per entry."""
    items = deliveries(pickle.loads(pickle.dumps(encode(outputs))))
    return [(rid, item if isinstance(item, BaseException) else join([item])) for rid, item in items]


def test_outputs_and_refusals_survive_the_trip():
    first = RequestOutput("a", [CompletionOutput(0, "hé", [5, 6], [TokenLogprob(5, -0.5, [(5, -0.5), (7, -1.0)]),
                                                                   TokenLogprob(6, -0.1)], None, -0.6)],
                          False, 3, prompt_logprobs=[None, TokenLogprob(2, -2.0)], queue_time=0.25)
    last = RequestOutput("b", [CompletionOutput(1, "", [], None, "error")], True, 2, error="boom")
    refused = QueueFullError("the queue is full")
    back = trip([("a", first), ("b", last), ("c", refused)])
    assert back[:2] == [("a", first), ("b", last)]
    assert back[2][0] == "c" and isinstance(back[2][1], QueueFullError) and str(back[2][1]) == "the queue is full"


def test_frames_are_read_whole_however_the_bytes_arrive():
    read_end, write_end = os.pipe()
    try:
        payloads = [b"x" * 10, b"", b"y" * 5000]
        for p in payloads:
            write_frame(write_end, p)
        reader = FrameReader(read_end, chunk_bytes=7)  # every frame arrives split over several reads
        got = []
        while len(got) < len(payloads):
            got += reader.read()
        assert got == payloads
        os.close(write_end)
        write_end = None
        with pytest.raises(EOFError):
            reader.read()
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


def test_merged_outputs_cover_both_steps():
    a = RequestOutput("r", [CompletionOutput(0, "To", [1], [TokenLogprob(1, -1.0)], None, -1.0)], False, 4)
    b = RequestOutput("r", [CompletionOutput(0, " be", [2], [TokenLogprob(2, -2.0)], "length", -3.0),
                            CompletionOutput(1, "!", [3], None, "stop", -0.5)], True, 4)
    merged = merge_outputs(a, b)
    assert merged.finished
    first, second = merged.outputs
    assert (first.text, first.token_ids, first.finish_reason, first.cumulative_logprob) == ("To be", [1, 2], "length", -3.0)
    assert [e.token_id for e in first.logprobs] == [1, 2]
    assert (second.index, second.text) == (1, "!")


def test_entries_of_several_steps_join_as_merged_outputs_do():
    steps = [
        RequestOutput("r", [CompletionOutput(0, "To", [1], [TokenLogprob(1, -1.0, [(1, -1.0)])], None, -1.0)], False, 4,
                      prompt_logprobs=[None, TokenLogprob(9, -3.0)], queue_time=0.5),
        RequestOutput("r", [CompletionOutput(0, " be", [2, 3], [TokenLogprob(2, -2.0), TokenLogprob(3, -0.1)], None,
                                             -3.1)], False, 4),
        RequestOutput("r", [CompletionOutput(0, "", [], [], "length", -3.1),
                            CompletionOutput(1, "!", [4], None, "stop", -0.5, score=-0.25)], True, 4, error="late"),
    ]
    entries = [entry for _, entry in deliveries(encode([("r", step) for step in steps]))]
    expected = copy.deepcopy(steps[0])
    for step in steps[1:]:
        expected = merge_outputs(expected, copy.deepcopy(step))
    assert join(entries) == expected
    assert join(entries).outputs[0].token_ids == [1, 2, 3]
