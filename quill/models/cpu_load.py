"""How many of this process's CPUs other processes keep busy: what a CPU engine's thread count makes room for.

OpenMP's barriers wait for the slowest thread: a step on two threads beside a process busy on one of the two
cores runs at the pace of the descheduled thread, two to four times slower than on one thread. Reading the busy
time that /proc/stat counts on the CPUs of this process's affinity mask (a VM's steal time included: its host gave
the core away) and taking away this process's own (/proc/self/stat) says how much of those CPUs others used since
the last reading, with no probing steps. Linux only; elsewhere nothing is known.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# /proc/stat's per-CPU columns that count a CPU busy: user, nice, system, irq, softirq, steal (guest time is
# already inside user)
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


class OtherLoad:
    def __init__(self, stat: Path = Path("/proc/stat"), own: Path = Path("/proc/self/stat")):
        self.stat, self.own = stat, own
        try:
            self.cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        except AttributeError:  # no affinity masks: every CPU
            self.cpus = {f"cpu{i}" for i in range(os.cpu_count() or 1)}
        self.ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()

    def _read(self) -> tuple[float, int, int] | None:
        """(now, busy ticks on our CPUs, this process's ticks), None where /proc cannot be read."""
        try:
            lines = self.stat.read_text().splitlines()
            own = self.own.read_text().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        except (OSError, IndexError):
            return None
        busy = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in self.cpus:
                values = rest.split()
                busy += sum(int(values[i]) for i in BUSY_COLUMNS if i < len(values))
        return time.monotonic(), busy, int(own[11]) + int(own[12])  # utime and stime, fields 14 and 15

    def cores(self) -> float | None:
        """CPUs' worth of our CPUs' time that other processes used since the last call (or since made)."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[0] <= last[0]:
            return None
        others = (now[1] - last[1]) - (now[2] - last[2])
        return max(0.0, others / self.ticks_per_second / (now[0] - last[0]))
