"""Sending encoded event batches over ZMQ in vLLM's protocol, from a thread of its own.

Every batch goes out on a PUB socket as three frames: the topic, its sequence number (8 bytes, big-endian, from 0,
one per batch, no gaps) and the msgpack payload. The last `buffer_steps` batches are kept; a ROUTER socket answers
a request [empty frame, first sequence number (8 bytes, big-endian)] (what a REQ socket sends, or a DEALER that
adds the empty frame) with one [empty, sequence number, payload] message per kept batch from there on, then
[empty, -1 (8 bytes, big-endian, signed), empty] to end the replay.

The engine thread only hands payloads over an in-process PUSH socket with no limit, which never waits; this thread
owns the network sockets. A PUB socket drops what a slow subscriber cannot take past its high-water mark, and a
ROUTER what its peer cannot take, so nothing here waits on the network either: a subscriber that sees a gap in the
sequence numbers asks for a replay.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque

import zmq

from .config import KVEventsConfig, binds

log = logging.getLogger("quill.engine")

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
CLOSE_LINGER_MS = 1000  # how long closing waits for queued messages to reach subscribers
PIPE = "inproc://kv-events"  # in the publisher's own ZMQ context: one name serves every publisher


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig):
        """Binds (or connects) its sockets now, so that a bad endpoint fails at startup, then starts its thread."""
        self.config = config
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.set_hwm(0)
        self._pull.bind(PIPE)
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = None
        try:
            (self._pub.bind if binds(config.endpoint) else self._pub.connect)(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.set_hwm(config.buffer_steps + 1)  # a whole replay fits: past the mark ROUTER drops
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as e:
            self._context.destroy(linger=0)
            raise ValueError(f"KV events: cannot open {config.endpoint} / {config.replay_endpoint}: {e}") from None
        self._push = self._context.socket(zmq.PUSH)  # the engine thread's end
        self._push.set_hwm(0)
        self._push.connect(PIPE)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self.num_dropped = 0  # batches handed over after the thread stopped
        self._seq = itertools.count()  # the next batch's sequence number
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, payload: bytes) -> None:
        """Queue one encoded batch (from the engine thread: never waits)."""
        try:
            self._push.send(payload, zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the pipe has no limit: only a publisher thread that died leaves it with no reader
            self.num_dropped += 1

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, then close (from the thread that publishes)."""
        try:
            self._push.send(b"", zmq.NOBLOCK)  # no batch is empty: the thread's signal to stop
        except zmq.Again:
            pass  # the thread is gone already
        self._thread.join(timeout)
        self._push.close(linger=0)
        if not self._thread.is_alive():
            self._context.term()

    # ---- the publisher thread ------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while not self._stopping:
                ready = dict(poller.poll())
                self._send_queued()
                if self._replay in ready:
                    self._serve_replay()
        except Exception:  # the engine goes on without events; subscribers see them stop
            log.exception("the KV-events publisher stopped")
        finally:
            for sock in (self._pull, self._pub, self._replay):
                if sock is not None:
                    sock.close(linger=CLOSE_LINGER_MS)

    def _send_queued(self) -> None:
        """Publish every batch handed over so far: a replay then holds all that came before its request."""
        while not self._stopping:
            try:
                payload = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not payload:
                self._stopping = True
                return
            seq = next(self._seq)
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), copy=False)
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
            log.warning("KV events: ignored a replay request of %d frames; expected [empty, 8-byte sequence number]",
                        len(frames) - 1)
            return
        self._send_queued()
        peer, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= first:
                self._replay.send_multipart((peer, b"", seq.to_bytes(8, "big"), payload), copy=False)
        self._replay.send_multipart((peer, b"", END_OF_REPLAY, b""))
