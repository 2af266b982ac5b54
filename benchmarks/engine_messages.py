"""What one step's outputs cost on their way up the engine process's pipe, without the pipe: encoding them
into a frame (the engine process), decoding the frame (the API process's reader thread), and reading each
request's output off its stream (`merge_outputs` of one step's output).

    python -m benchmarks.engine_messages                       # 256 requests a step, with and without logprobs
    python -m benchmarks.engine_messages --requests 64 --top 5

Figures are microseconds per step, the fastest of several repeats; the machine is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import timeit

from quill.server.engine.core import EngineStats
from quill.server.engine.process.messages import UP, StepOutputs
from quill.server.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob, merge_outputs
from quill.server.engine.process.wire import HEADER_BYTES, MessageReader, MessageWriter

from .common.hardware import describe_machine


def step(num_requests: int, top: int | None) -> StepOutputs:
    """A decode step's message: one token per request, with log-probabilities and `top` alternatives if given."""
    outputs = []
    for i in range(num_requests):
        logprobs = None if top is None else [TokenLogprob(1234, -0.5, [(1234 + j, -0.5 - j) for j in range(top)])]
        outputs.append(RequestOutput(f"cmpl-{i:032x}-0", [CompletionOutput(0, " tok", [1234], logprobs, None, -12.5)],
                                     False, 32))
    return StepOutputs(outputs, EngineStats(num_running=num_requests), num_requests)


def fastest_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def measure(message: StepOutputs, number: int) -> dict:
    read_end, write_end = os.pipe()  # the reader and writer want one; nothing is written to it
    try:
        writer, reader = MessageWriter(write_end), MessageReader(read_end, UP)
        frame = bytes(writer.encode([message])[HEADER_BYTES:])
        decoded = reader.decode(frame)
        return {
            "frame_bytes": len(frame),
            "encode_us": fastest_us(lambda: writer.encode([message]), number),
            "decode_us": fastest_us(lambda: reader.decode(frame), number),
            "stream_read_us": fastest_us(lambda: [merge_outputs([out]) for out in decoded.outputs], number),
        }
    finally:
        os.close(read_end)
        os.close(write_end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256, help="requests in the step")
    parser.add_argument("--top", type=int, default=1, help="alternatives per token in the run with logprobs")
    parser.add_argument("--number", type=int, default=200, help="calls per repeat")
    args = parser.parse_args()
    results = {"machine": describe_machine(), "requests": args.requests}
    for name, top in (("no logprobs", None), (f"logprobs, {args.top} alternatives", args.top)):
        results[name] = figures = measure(step(args.requests, top), args.number)
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in figures.items()))
    print(json.dumps(results["machine"]))


if __name__ == "__main__":
    main()
