"""Torch's CPU thread count for one engine's step thread, re-picked from measured decode steps.

With every core free, a step runs fastest on all of them; with another process (or another hosted
model, or the HTTP side of this one) busy on a core, OpenMP's barriers wait for the descheduled thread
and one thread is several times faster than two. So, like the trainer, each engine probes the
candidate counts on a few decode steps, keeps the fastest, and probes again every so often or when
steps turn slow. The count is set per thread (OpenMP keeps it per thread), so each hosted model's
engine picks its own.
"""

from __future__ import annotations

import time

import torch

from quill.models.threads import ThreadTuner, available_cores

from .core import StepStats


class StepThreads:
    def __init__(self, fixed: int | None = None):
        """`fixed`: always this many threads; None: pick among 1, half and all cores."""
        self.tuner = ThreadTuner([fixed]) if fixed else ThreadTuner.for_cores(available_cores())
        self.current: int | None = None
        self._started = 0.0

    def before_step(self) -> None:
        threads = self.tuner.next_threads()
        if threads != self.current:
            torch.set_num_threads(threads)
            self.current = threads
        self._started = time.perf_counter()

    def after_step(self, stats: StepStats) -> None:
        """Only decode-only steps are timed: their cost per sequence is comparable from step to step."""
        if stats.num_seqs and stats.num_tokens == stats.num_seqs:
            self.tuner.record(self.current, (time.perf_counter() - self._started) / stats.num_seqs)


def step_threads(device: torch.device, threads: int | str | None) -> StepThreads | None:
    """What an engine's steps on `device` run with: on the CPU, `threads` if a number, re-picked among the cores
    this process may use (its affinity mask capped by its cgroup's CPU quota) if "auto"; None (torch's own count)
    off the CPU or without `threads`."""
    if device.type != "cpu" or threads is None:
        return None
    return StepThreads(None if threads == "auto" else threads)
