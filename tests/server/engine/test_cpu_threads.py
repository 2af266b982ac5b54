"""The CPU engine's thread count: the usable cores others leave free, changed only after two readings agree."""

from __future__ import annotations

import pytest

from quill.server.engine import cpu_threads
from quill.server.engine.cpu_threads import StepThreads, fitted_threads


@pytest.mark.parametrize("cores, others, threads", [(2, None, 2), (2, 0.2, 2), (2, 0.6, 1), (2, 1.9, 1),
                                                    (4, 1.4, 3), (4, 3.8, 1), (1, 0.9, 1)])
def test_fitted_threads(cores, others, threads):
    assert fitted_threads(cores, others) == threads


class FakeLoad:
    def __init__(self, readings):
        self.readings = list(readings)

    def cores(self):
        return self.readings.pop(0)


def test_the_count_follows_two_agreeing_readings(monkeypatch):
    clock = [0.0]
    set_to = []
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(cpu_threads.torch, "set_num_threads", set_to.append)
    threads = StepThreads(load=FakeLoad([1.0, 0.1, 1.0, 1.1, 0.0, 0.2]))
    seen = []
    for _ in range(6):
        clock[0] += 1.5
        threads.before_step()
        threads.before_step()  # within the second: no reading
        seen.append(threads.current)
    assert seen == [2, 2, 2, 1, 1, 2]  # a lone busy reading changes nothing; two do, and two quiet ones undo it
    assert set_to == [1, 2]


def test_a_fixed_count_is_set_once(monkeypatch):
    set_to = []
    monkeypatch.setattr(cpu_threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(cpu_threads.torch, "set_num_threads", set_to.append)
    threads = StepThreads(fixed=1)
    for _ in range(3):
        threads.before_step()
    assert set_to == [1] and threads.load is None


def test_omp_num_threads_bounds_the_cores(monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads.usable_cores() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert cpu_threads.usable_cores() == 4
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_threads.usable_cores() == 4
