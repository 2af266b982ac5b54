"""What the loop driving an `EngineCore` does between and around steps, wherever it runs.

The same code serves the engine thread (`AsyncEngine`) and the engine process (`core_process`):
requests and aborts are applied between steps, a step's outputs come back as (request id, item)
pairs to deliver, and a step that raises fails only the requests it was running (their cache is
freed and rebuilt) while the loop goes on serving the rest, unless the device itself is lost
(faults.py), or a rank of a tensor-parallel group (parallel/driver.py): then the step raises DeviceLostError and
the loop must stop.
"""

from __future__ import annotations

import logging

import torch

from ..core import EngineCore
from ..current_device import make_current
from ..cpu_threads import StepThreads
from ..faults import DeviceLostError, device_lost
from ..outputs import CompletionOutput, RequestOutput
from ..scheduler import QueueFullError

log = logging.getLogger("quill.engine")

Delivery = tuple[str, object]  # (request id, RequestOutput or the exception its stream raises)


def step_error_message(e: Exception) -> str:
    """What a failed request's client reads: out-of-memory named plainly, anything else by its type."""
    if isinstance(e, torch.OutOfMemoryError):
        return f"out of GPU memory while generating ({e}); the request was dropped, the server goes on"
    return f"internal error while generating: {type(e).__name__}: {e}"


class CoreLoop:
    def __init__(self, core: EngineCore, threads: StepThreads | None = None):
        """Made on the thread that will step the core."""
        make_current(core.loaded.device)
        self.core = core
        self.threads = threads

    def add(self, request_id: str, prompt_token_ids: list[int], params) -> Delivery | None:
        """Queue a request; a refusal (queue full, a bad request) comes back as its stream's error."""
        try:
            self.core.add_request(request_id, prompt_token_ids, params)
        except (QueueFullError, ValueError) as e:
            return request_id, e
        return None

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    def step(self) -> list[Delivery]:
        """One step (the caller checked `core.has_work()`); a fault fails the requests it was running."""
        try:
            if self.threads is not None:
                self.threads.before_step()
            outputs = self.core.step()
        except Exception as e:  # a fault in the model (CUDA out of memory included) must not take the server down
            log.exception("engine step failed")
            if isinstance(e, DeviceLostError):  # the model says so itself (a tensor-parallel group that broke)
                raise
            if device_lost(self.core.loaded.device):
                raise DeviceLostError(f"{self.core.loaded.device} can run nothing more after "
                                      f"{type(e).__name__}: {e}; the server must be restarted") from e
            return self._fail_running(step_error_message(e))
        return [(out.request_id, out) for out in outputs]

    def _fail_running(self, message: str) -> list[Delivery]:
        """Fail the requests the step was running and free their cache. A step can die halfway through its
        bookkeeping, so the cache is then rebuilt (waiting requests hold no cache), keeping only the prefixes
        that finished steps wrote."""
        failed = []
        self.core.discard_in_flight()  # with async scheduling, a step of those same requests may be launched
        for group in list(self.core.scheduler.running):
            self.core.abort(group.request_id)
            outs = [CompletionOutput(i, "", [], None, "error") for i in range(group.params.n)]
            failed.append((group.request_id,
                           RequestOutput(group.request_id, outs, True, len(group.prompt_token_ids), error=message)))
        self.core.reset_cache()
        return failed
