"""OtherLoad: the CPU time others used on this process's CPUs, from /proc/stat less /proc/self/stat (fake files
here, then the real ones beside a process that spins)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from quill.models import cpu_load
from quill.models.cpu_load import OtherLoad

STAT = "cpu  {t} 0 0 0 0 0 0 0 0 0\ncpu0 {a} 1 {a} 500 7 0 0 {steal} 0 0\ncpu1 {b} 0 0 900 0 0 0 0 0 0\nintr 1 2 3\n"
OWN = "1234 (quill serve (x)) R 1 1 1 0 -1 4194304 10 0 0 0 {u} {s} 0 0 20 0 3 0\n"


def _write(tmp_path, a, b, steal, u, s):
    (tmp_path / "stat").write_text(STAT.format(t=a + b, a=a, b=b, steal=steal))
    (tmp_path / "own").write_text(OWN.format(u=u, s=s))


def test_others_are_the_busy_ticks_of_our_cpus_less_our_own(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_load.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(cpu_load.os, "sysconf", lambda name: 100)
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(cpu_load.time, "monotonic", lambda: next(clock))
    _write(tmp_path, a=100, b=50, steal=3, u=40, s=10)
    load = OtherLoad(tmp_path / "stat", tmp_path / "own")
    # 2 s later cpu0 was busy 2 * 80 + 20 (steal) ticks of which this process used 50 + 20; cpu1 is not ours
    _write(tmp_path, a=180, b=900, steal=23, u=90, s=30)
    assert load.cores() == pytest.approx((160 + 20 - 70) / 100 / 2)


def test_no_proc_means_nothing_known(tmp_path):
    assert OtherLoad(tmp_path / "missing", tmp_path / "missing").cores() is None


@pytest.mark.skipif(not os.path.exists("/proc/stat") or not hasattr(os, "sched_getaffinity"), reason="needs Linux")
def test_a_spinning_neighbor_shows_on_the_real_files():
    cpu = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        time.sleep(0.3)
        load = OtherLoad()
        time.sleep(1.0)
        assert load.cores() >= 0.7  # one core's worth, less what the test process and scheduling take
    finally:
        spinner.kill()
        spinner.wait()
