"""One engine loop per hosted model, on a thread of this process, with an asyncio face.

The step thread owns the `EngineCore`; the event loop only drops requests and aborts
into an inbox and reads outputs from per-request queues, so HTTP handling never waits
on a forward pass (torch releases the GIL while it computes). The two still share one
interpreter: `ProcessEngine` runs the core in a process of its own instead.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from quill.models.loading.checkpoint import LoadedModel

from ..core import EngineConfig, EngineCore
from .core_loop import CoreLoop
from ..cpu_threads import step_threads
from .frontend import EngineFrontend
from .messages import AbortRequest, AddRequest, MessageKind

log = logging.getLogger("quill.engine")


class AsyncEngine(EngineFrontend):
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, name: str | None = None,
                 threads: int | str | None = None):
        """`threads`: torch CPU threads for the steps: a number, "auto" (the usable cores that other processes
        leave free, cpu_threads.py; log-probabilities may differ in their last bits between thread counts), or
        None (torch's choice)."""
        self.core = EngineCore(loaded, config)
        super().__init__(name or loaded.name, self.core.config)
        self.threads = step_threads(loaded.device, threads)
        self._inbox: deque[AddRequest | AbortRequest] = deque()  # what ProcessEngine sends down its pipe, not encoded
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def cache_bytes(self) -> int:
        return self.core.cache_bytes

    @property
    def num_kv_blocks(self) -> int | None:
        return self.core.num_kv_blocks

    def describe_cache(self) -> str:
        return self.core.describe_cache()

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:  # never started: nothing else uses the core
            self.core.close()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead_reason is None

    @property
    def num_pending(self) -> int:
        return len(self.core.scheduler.waiting) + sum(1 for m in list(self._inbox) if m.kind is MessageKind.ADD)

    def _send_add(self, request_id: str, prompt_token_ids: list[int], params) -> None:
        self._inbox.append(AddRequest(request_id, prompt_token_ids, params))
        self._wake.set()

    def _send_abort(self, request_id: str) -> None:
        self._inbox.append(AbortRequest(request_id))
        self._wake.set()

    # ---- the step thread -----------------------------------------------------------

    def _drain_inbox(self, loop: CoreLoop) -> None:
        refused = []
        while self._inbox:
            message = self._inbox.popleft()
            if message.kind is MessageKind.ABORT:
                loop.abort(message.request_id)
            elif message.request_id in self._streams:  # else its client left before it was queued
                refused += filter(None, [loop.add(message.request_id, message.prompt_token_ids, message.params)])
        self._deliver_all(refused)

    def _run(self) -> None:
        loop = CoreLoop(self.core, self.threads)
        try:
            while not self._stop.is_set():
                self._drain_inbox(loop)
                if not self.core.has_work():
                    self._report(self.core.stats(stepped=False))  # aborts may have emptied it: report the idle state
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                self._deliver_all(loop.step())
                self._report(self.core.stats())
        except BaseException as e:  # the loop itself broke: report it, fail everyone waiting
            log.exception("engine loop stopped")
            self._fail_all(f"engine loop stopped: {type(e).__name__}: {e}")
        finally:
            self.core.close()
