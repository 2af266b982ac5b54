"""Pick torch's CPU thread count from measured step times, and keep re-picking it: for training steps
and for an engine's steps on the CPU alike.

On a machine shared with other jobs the best count changes during a run: with every core free,
using all of them wins (~1.7x on 2 cores); with another process on a core, OpenMP's barriers wait
for the descheduled thread and a single thread is 2-4x faster than two. So each candidate runs a
few probe steps and the fastest (median step time) is kept, until `retune_every` steps pass or
steps turn `slowdown` times slower than the winner's probes (someone else started work).
"""

import os
import statistics
from collections import Counter


def available_cores() -> int:
    """Cores this process may run on (affinity/cgroup-aware where the OS tells us), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


class ThreadTuner:
    def __init__(self, candidates: list[int], retune_every: int = 50, probe_steps: int = 3, slowdown: float = 1.5):
        if not candidates or min(candidates) < 1:
            raise ValueError("need at least one thread count, each >= 1")
        self.candidates = sorted(set(candidates), reverse=True)
        self.retune_every = retune_every
        self.probe_steps = probe_steps
        self.slowdown = slowdown
        self.chosen = self.candidates[0]
        self.chosen_seconds = None  # median probe step time of the chosen count
        self.probe_plan = self._new_probe_plan()  # thread counts for the coming probe steps
        self.probe_times: dict[int, list[float]] = {}
        self.steps_since_probe = 0
        self.slow_streak = 0
        self.steps_per_count: Counter[int] = Counter()

    @classmethod
    def for_cores(cls, cores: int, **kwargs) -> "ThreadTuner":
        return cls(sorted({1, max(1, cores // 2), cores}), **kwargs)

    def _new_probe_plan(self) -> list[int]:
        if len(self.candidates) == 1:
            return []
        return [count for count in self.candidates for _ in range(self.probe_steps)]

    def next_threads(self) -> int:
        """The thread count to run the next step with."""
        threads = self.probe_plan[0] if self.probe_plan else self.chosen
        self.steps_per_count[threads] += 1
        return threads

    def record(self, threads: int, seconds: float) -> None:
        """Report how long the step given by `next_threads` took."""
        if self.probe_plan:
            self.probe_plan.pop(0)
            self.probe_times.setdefault(threads, []).append(seconds)
            if not self.probe_plan:
                medians = {count: statistics.median(times) for count, times in self.probe_times.items()}
                self.chosen = min(medians, key=medians.get)
                self.chosen_seconds = medians[self.chosen]
                self.probe_times, self.steps_since_probe, self.slow_streak = {}, 0, 0
            return
        if self.chosen_seconds is None:  # a single candidate: nothing to choose
            return
        self.steps_since_probe += 1
        self.slow_streak = self.slow_streak + 1 if seconds > self.slowdown * self.chosen_seconds else 0
        if self.steps_since_probe >= self.retune_every or self.slow_streak >= 3:
            self.probe_plan = self._new_probe_plan()
