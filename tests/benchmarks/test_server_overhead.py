"""server_overhead end to end on a tiny workload: real servers, CPU per token, server flags side by side.
Structure, never speed."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks.server_overhead import main


def test_settings_are_served_side_by_side_with_each_sides_cpu(tmp_path, capsys):
    out = tmp_path / "server_overhead.json"
    results = main(["--modes", "process", "--rounds", "1", "--num-requests", "6", "--concurrency", "3",
                    "--max-tokens", "4", "--server-args", "asyncio=--loop asyncio", "--server-args", "h11=--http h11",
                    "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["http_over_in_process"]) == {"process asyncio", "process h11"}
    for label, figures in results["http_medians"].items():
        assert figures["tokens_per_s"] > 0 and 0 < figures["events_per_token"] <= 1
        assert figures["load_generator_cpu_us_per_token"] > 0
        if sys.platform == "linux":  # both processes' CPU times come from /proc, in 10 ms ticks: a run this short
            # can spend less than one tick in the engine process, so each is measured (not None) and not negative
            assert figures["api_cpu_us_per_token"] >= 0 and figures["engine_cpu_us_per_token"] >= 0
    assert results["median_tokens_per_s"]["in_process"] > 0
    assert "HTTP, engine process h11" in capsys.readouterr().out


def test_an_unknown_server_flag_is_refused_before_any_server_starts(monkeypatch):
    monkeypatch.setattr("benchmarks.server_overhead.server_process", None)  # starting one would fail otherwise
    with pytest.raises(ValueError, match="quill serve has no flag --lop"):
        main(["--server-args", "typo=--lop asyncio"])
