"""The step-inputs benchmark runs, and its churn run really has sequences come and go while the steady run keeps
decoding the same ones."""

from __future__ import annotations

from benchmarks import step_inputs


def test_steady_and_churn_runs_time_every_step(capsys, monkeypatch):
    monkeypatch.setattr(step_inputs, "FIRST_FINISH", 4)
    rows = step_inputs.main(["--seqs", "6", "--steps", "8", "--vocab", "64"])
    assert [(r["run"], r["async_scheduling"]) for r in rows] == [
        ("steady", False), ("churn", False), ("steady", True), ("churn", True)]
    assert all(r["steps"] == 8 and r["input_ms_median"] > 0 for r in rows)
    assert "6 seqs: input building median" in capsys.readouterr().out


def test_churn_replaces_finished_sequences_with_new_ones(monkeypatch):
    monkeypatch.setattr(step_inputs, "FIRST_FINISH", 4)
    engines = []
    original = step_inputs.scripted_engine
    monkeypatch.setattr(step_inputs, "scripted_engine",
                        lambda *args, **kwargs: engines.append(original(*args, **kwargs)) or engines[-1])
    step_inputs.measure(6, 8, 64, churn=True, async_scheduling=False)
    (engine,) = engines
    running = {g.request_id for g in engine.scheduler.running}
    assert len(running) == 6 and running - {f"r{i}" for i in range(6)}  # finished ones were replaced by new ones
    assert engine.runner.num_delta_steps > 0  # steps kept the rows that stayed
