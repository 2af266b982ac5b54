"""One hosted model's engine with its core in a process of its own (see core_process.py).

The API process keeps the tokenizer and the model's metadata; requests and aborts go down a
pipe as typed messages (messages.py, framed by wire.py), written by a sender thread (a burst of long
prompts can fill the pipe while the core is in a long step, and the event loop must never wait for
that), and a reader thread takes the step messages off the other pipe and wakes each event loop once.
The step loop and the HTTP side then never compete for one interpreter. A core process that
dies is noticed at once (its end of the pipe closes): /ready and /health say so, open streams
fail with EngineDeadError and new requests are refused with 503.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import threading
import time

from ..core import EngineStats
from ..faults import EngineStartError
from .core_process import CoreSpec, run_core_process
from .frontend import EngineFrontend
from .messages import UP, AbortRequest, AddRequest, CoreInfo, Failed, Message, MessageKind, Stop
from .wire import MessageReader, MessageWriter

log = logging.getLogger("quill.engine")

STOP_POLL_SECONDS = 0.1  # while the engine process loads, how often start() looks whether the server is stopping


class EngineStartCancelled(EngineStartError):
    """The server began to stop while the engine process loaded its model: the process was ended."""


class ProcessEngine(EngineFrontend):
    def __init__(self, spec: CoreSpec, ready_timeout: float | None = None):
        super().__init__(spec.name, spec.engine_config)
        self.spec = spec
        self.ready_timeout = ready_timeout  # None: as long as loading takes
        self.info: CoreInfo | None = None
        self._process = None
        self._conn = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # messages for the sender thread; None ends it
        self._sender: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._stats = EngineStats()
        self._adds_sent = 0
        self._adds_received = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def cache_bytes(self) -> int:
        return self.info.cache_bytes if self.info else 0

    @property
    def num_kv_blocks(self) -> int | None:
        return self.info.num_kv_blocks if self.info else None

    def describe_cache(self) -> str:
        return self.info.cache_description if self.info else "not loaded"

    # ---- lifecycle -----------------------------------------------------------------

    def start(self, stop: threading.Event | None = None) -> None:
        """Spawn the engine process and wait until its model is loaded; raises EngineStartError with its reason.
        `stop` set before then: the process is killed (it ignores SIGTERM) and EngineStartCancelled raised."""
        if self._process is not None:
            return
        if stop is not None and stop.is_set():
            raise EngineStartCancelled(f"{self.name}: the server began to stop before its engine process started")
        context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA state
        child_conn, self._conn = context.Pipe(duplex=False)
        self._up, child_up = context.Pipe(duplex=False)
        self._process = context.Process(target=run_core_process, args=(child_conn, child_up, self.spec),
                                        name=f"quill-engine-{self.name}", daemon=True)
        self._process.start()
        child_conn.close()  # only the child holds its ends now: its death closes the pipe
        child_up.close()
        self._messages = MessageReader(self._up.fileno(), UP)
        self._writer = MessageWriter(self._conn.fileno())
        log.info("%s: engine process started (pid %d)", self.name, self._process.pid)
        message = self._first_message(stop)
        if message.kind is not MessageKind.READY:
            self._process.join(5)
            raise EngineStartError(f"{self.name}: {message.reason}")
        self.info = message.info
        self._reader = threading.Thread(target=self._read, name=f"engine-reader-{self.name}", daemon=True)
        self._reader.start()
        self._sender = threading.Thread(target=self._write, name=f"engine-sender-{self.name}", daemon=True)
        self._sender.start()

    def _first_message(self, stop: threading.Event | None) -> Message:
        """Ready, or Failed with the reason (the engine process's own, or what became of it)."""
        deadline = None if self.ready_timeout is None else time.monotonic() + self.ready_timeout
        while not self._messages.ready(STOP_POLL_SECONDS):
            if stop is not None and stop.is_set():
                self._process.kill()
                self._process.join()
                raise EngineStartCancelled(f"{self.name}: the server began to stop while its engine process loaded")
            if deadline is not None and time.monotonic() > deadline:
                self._process.kill()
                return Failed(f"the engine process did not load its model within {self.ready_timeout:.0f}s")
        try:
            return self._messages.read()[0]
        except (EOFError, OSError):
            self._process.join(5)
            return Failed(f"the engine process exited while loading (exit code {self._process.exitcode})")

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._process is None:
            return
        self._stopping = True
        if self._sender is not None:
            self._outbox.put(None)  # after every message queued before: it sends them, then Stop
            self._sender.join(timeout)
        else:  # the model never loaded: nothing else was sent
            self._send_or_fail([Stop()])
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._reader is not None:
            self._reader.join(timeout)

    @property
    def is_alive(self) -> bool:
        return (self._process is not None and self._process.is_alive() and self.info is not None
                and self.dead_reason is None)

    @property
    def num_pending(self) -> int:
        """The core's waiting requests at its last message, and those sent since that it had not yet seen."""
        return self._stats.num_waiting + self._adds_sent - self._adds_received

    # ---- the pipe ------------------------------------------------------------------

    def _send_add(self, request_id: str, prompt_token_ids: list[int], params) -> None:
        self._adds_sent += 1
        self._outbox.put(AddRequest(request_id, prompt_token_ids, params))

    def _send_abort(self, request_id: str) -> None:
        self._outbox.put(AbortRequest(request_id))

    def _write(self) -> None:
        """The sender thread: whatever has been queued goes down the pipe in one write, in order."""
        try:
            while True:
                messages = [self._outbox.get()]
                while not self._outbox.empty():
                    messages.append(self._outbox.get())
                stop = None in messages
                if stop:
                    messages = messages[: messages.index(None)] + [Stop()]
                if not self._send_or_fail(messages) or stop:
                    return
        except Exception as e:  # a message msgpack cannot encode: with no sender, every request would wait forever
            log.exception("%s: sending to the engine process failed", self.name)
            self._fail_all(f"engine process unreachable: {type(e).__name__}: {e}")
            self._stopping = True  # the engine process is of no use now: it is told to stop
            self._send_or_fail([Stop()])  # nothing of the failed write was written

    def _send_or_fail(self, messages: list[Message]) -> bool:
        try:
            self._writer.send(messages)
            return True
        except OSError:  # the process died: the reader tells every stream
            return False

    def _read(self) -> None:
        """The reader thread: every step message that has arrived, delivered with one wake-up per event loop."""
        try:
            while True:
                items = []
                for step in self._messages.read():
                    if step.kind is MessageKind.FAILED:  # its device is lost (faults.py): it exits after this
                        self._deliver_all(items)
                        log.error("%s: %s", self.name, step.reason)
                        self._fail_all(step.reason)
                        return
                    if step.kind is not MessageKind.STEP:
                        raise RuntimeError(f"a {step.kind.name} message after the engine process was ready")
                    items += [(out.request_id, out) for out in step.outputs]
                    items += [(refusal.request_id, refusal.error()) for refusal in step.refusals]
                    self._report(step.stats)
                self._stats, self._adds_received = step.stats, step.num_adds
                if items:
                    self._deliver_all(items)
        except (EOFError, OSError):
            pass
        except BaseException as e:  # a message this side cannot read: the engine is unusable
            log.exception("%s: reading the engine process failed", self.name)
            self._fail_all(f"engine process unreadable: {type(e).__name__}: {e}")
            return
        if not self._stopping:
            self._process.join(1)
            reason = f"engine process exited unexpectedly (exit code {self._process.exitcode})"
            log.error("%s: %s", self.name, reason)
            self._fail_all(reason)
