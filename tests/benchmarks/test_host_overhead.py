"""The host-overhead benchmark runs, and with long prompts times decode steps of every sequence at once."""

from __future__ import annotations

from benchmarks import host_overhead


def test_long_contexts_are_prefilled_before_timing_starts(capsys):
    rows = host_overhead.main(["--seqs", "6", "--steps", "3", "--vocab", "64", "--context", "40",
                               "--block-size", "4", "--settings", "greedy"])
    assert [(r["state"], r["setting"], r["context"], r["num_seqs"]) for r in rows] == [
        ("paged_kv", "greedy", 40, 6), ("slots", "greedy", 40, 6)]
    assert all(r["median_ms"] > 0 for r in rows)
    assert "6 seqs of 40+ tokens" in capsys.readouterr().out
