"""The Mamba-1 prefill benchmark's code paths on a tiny shape. Checks structure and agreement, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import mamba_prefill


def test_smoke_run_times_every_way_and_they_agree(tmp_path):
    out = tmp_path / "mamba.json"
    results = mamba_prefill.main(["--smoke", "--chunks", "4", "16", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["runs"]) == {"transformers", "quill, token loop", "quill, chunks of 4", "quill, chunks of 16"}
    for run in results["runs"].values():
        assert run["wall_s"] > 0 and run["logit_error"] < 1e-5
