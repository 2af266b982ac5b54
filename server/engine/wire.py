"""How a step's outputs cross the pipe from the engine process: plain tuples in length-prefixed frames.

Pickling 256 `RequestOutput`s (slotted dataclasses) took about 2 ms each way on a 2-core CPU, as long
as the step that made them; the same content as tuples of builtins takes a tenth of that. Requests'
refusals (QueueFullError, ValueError) travel as the exceptions they are.
"""

from __future__ import annotations

import os

from .outputs import CompletionOutput, RequestOutput, TokenLogprob


def _entries(entries: list[TokenLogprob | None] | None) -> list | None:
    if entries is None:
        return None
    return [None if e is None else (e.token_id, e.logprob, e.top) for e in entries]


def _tokens(entries: list | None) -> list[TokenLogprob | None] | None:
    if entries is None:
        return None
    return [None if e is None else TokenLogprob(*e) for e in entries]


def encode(deliveries: list[tuple[str, object]]) -> list[tuple]:
    wire = []
    for request_id, item in deliveries:
        if not isinstance(item, RequestOutput):
            wire.append((request_id, item))
            continue
        outs = [(c.index, c.text, c.token_ids, _entries(c.logprobs), c.finish_reason, c.cumulative_logprob, c.score)
                for c in item.outputs]
        extra = None  # what only a request's first or last output carries
        if item.prompt_logprobs is not None or item.error is not None or item.queue_time is not None:
            extra = (_entries(item.prompt_logprobs), item.error, item.queue_time)
        wire.append((request_id, outs, item.finished, item.num_prompt_tokens, extra))
    return wire


def decode(wire: list[tuple]) -> list[tuple[str, object]]:
    deliveries = []
    for entry in wire:
        if len(entry) == 2:
            deliveries.append(entry)
            continue
        request_id, outs, finished, num_prompt_tokens, extra = entry
        outputs = [CompletionOutput(index, text, token_ids, _tokens(logprobs), finish, cumulative, score)
                   for index, text, token_ids, logprobs, finish, cumulative, score in outs]
        out = RequestOutput(request_id, outputs, finished, num_prompt_tokens)
        if extra is not None:
            out.prompt_logprobs, out.error, out.queue_time = _tokens(extra[0]), extra[1], extra[2]
        deliveries.append((request_id, out))
    return deliveries


# ---- frames on a pipe ---------------------------------------------------------------------------
# The API process reads the engine's messages on a thread that shares the interpreter with the event
# loop. Each blocking read releases the interpreter lock, and taking it back from a busy event loop can
# wait a whole switch interval (5 ms): `Connection.recv` reads a header, then a body, so twice per
# message. Reading whatever has arrived in one `os.read` takes the lock back once per batch of messages.

HEADER_BYTES = 8


def write_frame(fd: int, payload: bytes) -> None:
    view = memoryview(len(payload).to_bytes(HEADER_BYTES, "little") + payload)
    while view:
        view = view[os.write(fd, view):]


class FrameReader:
    def __init__(self, fd: int, chunk_bytes: int = 1 << 20):
        self.fd = fd
        self.chunk_bytes = chunk_bytes
        self._buffer = bytearray()

    def read(self) -> list[bytes]:
        """Every whole frame that has arrived, waiting for at least one; EOFError once the writer is gone."""
        while True:
            frames = self._take_frames()
            if frames:
                return frames
            chunk = os.read(self.fd, self.chunk_bytes)
            if not chunk:
                raise EOFError("the engine process closed its pipe")
            self._buffer += chunk

    def _take_frames(self) -> list[bytes]:
        frames, start, buffer = [], 0, self._buffer
        while len(buffer) - start >= HEADER_BYTES:
            size = int.from_bytes(buffer[start:start + HEADER_BYTES], "little")
            end = start + HEADER_BYTES + size
            if end > len(buffer):
                break
            frames.append(bytes(buffer[start + HEADER_BYTES:end]))
            start = end
        del buffer[:start]
        return frames
