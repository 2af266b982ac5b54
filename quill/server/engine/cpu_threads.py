"""Torch's CPU thread count for one engine's step thread: as many as the cores this process may use leave free.

The cores it may use are its affinity mask capped by its cgroup's CPU quota (a container's `--cpus`, a pod's CPU
limit), which torch's own count ignores, and by OMP_NUM_THREADS where set. With every one of them free, a step runs fastest on all; with another
process busy on one, OpenMP's barriers wait for the descheduled thread and one thread fewer is two to four times
faster. So every `CHECK_SECONDS` the engine reads how many of its cores others kept busy (quill/models/cpu_load.py)
and runs on the rest, at least one; a change waits for two readings that agree, so a burst does not flip it. The
count is set per thread (OpenMP keeps it per thread), so each hosted model's engine has its own, and only when it
changes.
"""

from __future__ import annotations

import os
import time

import torch

from quill.models.cpu_load import OtherLoad
from quill.models.threads import available_cores

CHECK_SECONDS = 1.0


def usable_cores() -> int:
    """The cores the process may use, capped by OMP_NUM_THREADS where the environment sets one (a deliberate
    bound, as for any OpenMP program)."""
    cores = available_cores()
    bound = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(bound)) if bound.isdigit() and int(bound) > 0 else cores


def fitted_threads(cores: int, others: float | None) -> int:
    """Threads for `cores` usable cores of which others keep `others` busy (None: unknown, so none)."""
    busy = 0 if others is None else int(others + 0.5)
    return max(1, cores - busy)


class StepThreads:
    def __init__(self, fixed: int | None = None, load: OtherLoad | None = None):
        """`fixed`: always this many threads; None: fitted to what other processes leave free."""
        self.fixed = fixed
        self.cores = usable_cores()
        self.load = None if fixed else (load or OtherLoad())
        self.current = torch.get_num_threads()
        self.wanted = fixed or self.cores
        self._pending: int | None = None
        self._checked = time.monotonic()

    def before_step(self) -> None:
        if self.load is not None and time.monotonic() - self._checked >= CHECK_SECONDS:
            self._checked = time.monotonic()
            fitted = fitted_threads(self.cores, self.load.cores())
            if fitted == self._pending:
                self.wanted = fitted
            self._pending = fitted
        if self.wanted != self.current:
            torch.set_num_threads(self.wanted)
            self.current = self.wanted


def step_threads(device: torch.device, threads: int | str | None) -> StepThreads | None:
    """What an engine's steps on `device` run with: on the CPU, `threads` if a number, fitted to the cores this
    process may use and others leave free if "auto" (the server's default); None (torch's own count) off the CPU
    or without `threads`."""
    if device.type != "cpu" or threads is None:
        return None
    return StepThreads(None if threads == "auto" else threads)
