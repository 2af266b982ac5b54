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


def _cgroup(tmp_path, files: dict[str, str], own: str = "0::/\n"):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "self").write_text(own)
    return {"root": tmp_path, "own": tmp_path / "self"}


def test_the_cgroup_quota_is_read_from_v2_v1_or_nowhere(tmp_path):
    from quill.models.threads import cgroup_cpu_limit

    assert cgroup_cpu_limit(**_cgroup(tmp_path / "a", {"cpu.max": "150000 100000\n"})) == 1.5
    assert cgroup_cpu_limit(**_cgroup(tmp_path / "b", {"cpu.max": "max 100000\n"})) is None
    own_group = {"kubepods/pod1/cpu.max": "50000 100000\n", "cpu.max": "max 100000\n"}
    assert cgroup_cpu_limit(**_cgroup(tmp_path / "c", own_group, own="0::/kubepods/pod1\n")) == 0.5
    v1 = {"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert cgroup_cpu_limit(**_cgroup(tmp_path / "d", v1, own="1:cpu:/\n")) == 2.0
    assert cgroup_cpu_limit(**_cgroup(tmp_path / "e", {"cpu/cpu.cfs_quota_us": "-1\n",
                                                       "cpu/cpu.cfs_period_us": "100000\n"})) is None
    assert cgroup_cpu_limit(**_cgroup(tmp_path / "f", {})) is None


def test_available_cores_are_the_affinity_capped_by_the_quota(monkeypatch):
    from quill.models import threads

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: None)
    assert threads.available_cores() == 4
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 1.5)
    assert threads.available_cores() == 2
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 0.2)
    assert threads.available_cores() == 1
