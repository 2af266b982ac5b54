"""The Mamba-1 and Mamba-2 prefill benchmarks' code paths on tiny shapes. Check structure and agreement, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import mamba2_prefill, mamba_prefill


@pytest.mark.parametrize("benchmark, chunks, runs", [
    (mamba_prefill, ["4", "16"], {"quill, token loop", "quill, chunks of 4", "quill, chunks of 16"}),
    (mamba2_prefill, ["8", "64"], {"quill, chunks of 8", "quill, chunks of 64"}),
], ids=["mamba", "mamba2"])
def test_smoke_run_times_every_way_and_they_agree(tmp_path, benchmark, chunks, runs):
    out = tmp_path / "prefill.json"
    results = benchmark.main(["--smoke", "--chunks", *chunks, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["runs"]) == {"transformers", *runs}
    for name in runs:  # the last logits, against transformers'
        assert results["runs"][name]["logit_error"] < 1e-5, name
