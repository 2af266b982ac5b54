"""The thread-count tuner of training and the CPU engine: it keeps the fastest count and probes again."""

from unittest import mock

from quill.models.threads import ThreadTuner, available_cores


def run_steps(tuner: ThreadTuner, seconds_per_count: dict[int, float], num_steps: int) -> None:
    for _ in range(num_steps):
        threads = tuner.next_threads()
        tuner.record(threads, seconds_per_count[threads])


def test_thread_tuner_keeps_the_fastest_count_and_re_probes():
    tuner = ThreadTuner([1, 2], retune_every=10, probe_steps=2)
    run_steps(tuner, {2: 3.0, 1: 1.0}, 4)  # another job holds a core: one thread is faster
    assert tuner.chosen == 1
    run_steps(tuner, {2: 3.0, 1: 1.0}, 10)
    assert tuner.steps_per_count == {2: 2, 1: 12}

    run_steps(tuner, {2: 0.5, 1: 1.0}, 4)  # the machine is free again; the periodic probe notices
    assert tuner.chosen == 2


def test_thread_tuner_re_probes_early_when_steps_slow_down():
    tuner = ThreadTuner([1, 2], retune_every=1000, probe_steps=2)
    run_steps(tuner, {2: 1.0, 1: 2.0}, 4)
    assert tuner.chosen == 2
    run_steps(tuner, {2: 5.0, 1: 2.0}, 3 + 4)  # three slow steps, then a probe round
    assert tuner.chosen == 1


def test_a_fixed_thread_count_is_never_probed():
    tuner = ThreadTuner([3])
    run_steps(tuner, {3: 1.0}, 500)
    assert tuner.steps_per_count == {3: 500}


def test_available_cores_follow_the_affinity_mask():
    with mock.patch("os.sched_getaffinity", return_value={0, 3}, create=True):
        assert available_cores() == 2
