"""How messages (messages.py) cross the pipes between the API process and the engine process, both ways:
msgpack in length-prefixed frames.

Pickling a step's 256 `RequestOutput`s as slotted dataclasses took about 2 ms each way on a 2-core CPU,
as long as the step that made them; as tuples of builtins, 0.1 ms to encode and 0.07 ms to decode. As
msgspec Structs encoded as arrays (trailing defaults left out) they take 0.015 ms to encode and 0.06 ms to
decode, straight into the output types, with nothing left to build when a stream reads them. A request's
outputs of several steps are joined (`merge_outputs`) only when its stream is read.
"""

from __future__ import annotations

import os
import select

import msgspec

from .messages import Message

HEADER_BYTES = 8


class MessageWriter:
    """Writes messages to a pipe, several in one write."""

    def __init__(self, fd: int):
        self.fd = fd
        self._encoder = msgspec.msgpack.Encoder()

    def send(self, messages: list[Message]) -> None:
        write_all(self.fd, self.encode(messages))

    def encode(self, messages: list[Message]) -> bytearray:
        """The messages' frames, one after the other."""
        buffer = bytearray()
        for message in messages:
            start = len(buffer)
            self._encoder.encode_into(message, buffer, start + HEADER_BYTES)  # room left for the header
            buffer[start:start + HEADER_BYTES] = (len(buffer) - start - HEADER_BYTES).to_bytes(HEADER_BYTES, "little")
        return buffer


class MessageReader:
    """Reads the messages of one direction (`messages.DOWN` or `messages.UP`) off a pipe."""

    def __init__(self, fd: int, kinds: type, chunk_bytes: int = 1 << 20):
        self._frames = FrameReader(fd, chunk_bytes)
        self._decoder = msgspec.msgpack.Decoder(kinds)

    def read(self) -> list[Message]:
        """Every message that has arrived, waiting for at least one; EOFError once the writer is gone."""
        return [self.decode(frame) for frame in self._frames.read()]

    def decode(self, frame: bytes) -> Message:
        """One frame's message, of its type (msgspec.ValidationError if it is none of this direction's)."""
        return self._decoder.decode(frame)

    def ready(self, timeout: float | None) -> bool:
        return self._frames.ready(timeout)


# ---- frames on a pipe ---------------------------------------------------------------------------
# The API process reads the engine's messages on a thread that shares the interpreter with the event
# loop. Each blocking read releases the interpreter lock, and taking it back from a busy event loop can
# wait a whole switch interval (5 ms): `Connection.recv` reads a header, then a body, so twice per
# message. Reading whatever has arrived in one `os.read` takes the lock back once per batch of messages.


def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_frame(fd: int, payload: bytes) -> None:
    write_all(fd, len(payload).to_bytes(HEADER_BYTES, "little") + payload)


class FrameReader:
    def __init__(self, fd: int, chunk_bytes: int = 1 << 20):
        self.fd = fd
        self.chunk_bytes = chunk_bytes
        self._buffer = bytearray()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def ready(self, timeout: float | None) -> bool:
        """Whether bytes (or the writer's end) arrived within `timeout` seconds (None: however long it takes).
        `read` takes every whole frame, so a frame already buffered here is never left waiting for this."""
        return bool(self._poll.poll(None if timeout is None else timeout * 1000))

    def read(self) -> list[bytes]:
        """Every whole frame that has arrived, waiting for at least one; EOFError once the writer is gone."""
        while True:
            frames = self._take_frames()
            if frames:
                return frames
            chunk = os.read(self.fd, self.chunk_bytes)
            if not chunk:
                raise EOFError("the pipe's writer closed it")
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
