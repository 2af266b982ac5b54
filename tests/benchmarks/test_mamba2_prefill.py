"""The Mamba-2 prefill benchmark's code paths on a tiny shape. Checks structure and agreement, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import mamba2_prefill


def test_smoke_run_times_both_sides_and_they_agree(tmp_path):
    out = tmp_path / "mamba2.json"
    results = mamba2_prefill.main(["--smoke", "--chunks", "8", "64", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["runs"]) == {"transformers", "quill, chunks of 8", "quill, chunks of 64"}
    for run in results["runs"].values():
        assert run["wall_s"] > 0 and run["logit_error"] < 1e-5
