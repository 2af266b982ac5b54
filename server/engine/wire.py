"""How a step's outputs cross the pipe from the engine process: plain tuples in length-prefixed frames.

Pickling 256 `RequestOutput`s (slotted dataclasses) took about 2 ms each way on a 2-core CPU, as long
as the step that made them; the same content as tuples of builtins takes a tenth of that. The tuples stay
as they are until a request's stream is read: `join` then makes one `RequestOutput` of every step waiting
for it. Requests' refusals (QueueFullError, ValueError) travel as the exceptions they are.
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


def deliveries(wire: list[tuple]) -> list[tuple[str, tuple | BaseException]]:
    """(request_id, entry) per request of a step, an entry still in its wire form (`join` reads it when the
    request's stream is read, so outputs of several steps make one object), a refusal as its exception."""
    return [(entry[0], entry[1] if len(entry) == 2 else entry) for entry in wire]


def join(entries: list[tuple]) -> RequestOutput:
    """One output from consecutive wire entries of one request, as `merge_outputs` would join them: each
    completion's texts, tokens and log-probabilities in order, its latest finish reason and scores."""
    request_id, _, finished, num_prompt_tokens, _ = entries[-1]
    completions: dict[int, CompletionOutput] = {}
    prompt_logprobs = error = queue_time = None
    for _, outs, _, _, extra in entries:
        for index, text, token_ids, logprobs, finish, cumulative, score in outs:
            c = completions.get(index)
            if c is None:
                completions[index] = CompletionOutput(index, text, list(token_ids), _tokens(logprobs), finish,
                                                      cumulative, score)  # a list of its own: extended below
                continue
            c.text += text
            c.token_ids += token_ids
            if logprobs is not None:
                c.logprobs = (c.logprobs or []) + _tokens(logprobs)
            c.finish_reason, c.cumulative_logprob, c.score = finish, cumulative, score
        if extra is not None:  # what only a request's first or last output carries
            prompt_logprobs = prompt_logprobs if prompt_logprobs is not None else _tokens(extra[0])
            error = error or extra[1]
            queue_time = queue_time if queue_time is not None else extra[2]
    return RequestOutput(request_id, list(completions.values()), finished, num_prompt_tokens, prompt_logprobs, error,
                         queue_time)


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
