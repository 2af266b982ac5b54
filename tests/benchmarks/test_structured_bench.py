"""structured_bench in miniature: every part runs and writes its figures; the coverage probe tells a refused
keyword from one an engine drops."""

from __future__ import annotations

import json

from benchmarks import structured_bench
from benchmarks.structured_engines import available_engines


def test_smoke_run_writes_every_part(tmp_path, capsys):
    out = tmp_path / "so.json"
    structured_bench.main(["--requests", "4", "--max-tokens", "8", "--rounds", "1", "--vocab-sizes", "2000",
                           "--out", str(out)])
    results = json.loads(out.read_text())
    throughput = results["throughput"]
    assert set(throughput["median_tokens_per_s"]) == {"constrained", "unconstrained"}
    assert throughput["constrained_over_unconstrained"] > 0 and throughput["mask_fill_us_per_row"] > 0
    assert set(results["apply"]["2000"]) == {"us_per_row_all_rows", "us_per_row_half_rows"}
    engines = results["engines"]["2000"]
    assert set(engines) == {engine.name for engine in available_engines()}
    coverage = engines["llguidance"]["coverage"]
    assert coverage["if/then/else"].startswith("refused") and coverage["pattern"] == "enforced"
    assert "IGNORED" not in json.dumps(coverage)  # llguidance refuses what it cannot enforce
    assert "median tok/s" in capsys.readouterr().out
