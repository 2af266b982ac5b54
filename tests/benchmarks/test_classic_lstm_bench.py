"""The classic LSTM benchmark's code path on a tiny shape, in seconds. Checks structure, never speed."""

from __future__ import annotations

import json
import os

from benchmarks.classic_lstm_bench import main


def test_tiny_shape_runs_and_reports(tmp_path, capsys):
    cache_before = os.environ.get("QUILL_CACHE_DIR")
    out = tmp_path / "bench.json"
    results = main(["--vocab-size", "300", "--embed", "8", "--hidden", "16", "--requests", "4",
                    "--serial-requests", "2", "--prompt-len", "5", "--max-tokens", "3", "--repeats", "2",
                    "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["model"]["shape"] == {"vocab_size": 300, "d_embed": 8, "layer_sizes": [16, 16, 8]}
    assert len(results["tokens_per_s_at_once"]) == len(results["tokens_per_s_one_at_a_time"]) == 2
    assert results["ratio_of_medians"] > 0 and results["machine"]["threads"] == 1
    assert "tokens/s with 4 at once" in capsys.readouterr().out
    assert os.environ.get("QUILL_CACHE_DIR") == cache_before  # the run's own cache is not left behind
