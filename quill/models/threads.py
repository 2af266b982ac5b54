"""Pick torch's CPU thread count from measured step times, and keep re-picking it: for training steps
and for an engine's steps on the CPU alike.

On a machine shared with other jobs the best count changes during a run: with every core free,
using all of them wins (~1.7x on 2 cores); with another process on a core, OpenMP's barriers wait
for the descheduled thread and a single thread is 2-4x faster than two. So each candidate runs a
few probe steps and the fastest (median step time) is kept, until `retune_every` steps pass or
steps turn `slowdown` times slower than the winner's probes (someone else started work).
"""

import math
import os
import statistics
from collections import Counter
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, own: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs this process's cgroup may use per period (a container's --cpus, a pod's CPU limit), None where no
    quota is set. cgroup v2's cpu.max in the process's own group (`own` names it), else v1's cfs quota."""
    group = ""
    try:
        for line in own.read_text().splitlines():
            if line.startswith("0::"):
                group = line[3:].strip().lstrip("/")
    except OSError:
        pass
    for folder in dict.fromkeys((root / group, root)):  # a container sees its own group at the root
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cores() -> int:
    """Cores this process may run on: its affinity mask, capped by its cgroup's CPU quota (rounded up), at least
    1. torch's own default counts the machine's cores, quota or not."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


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
