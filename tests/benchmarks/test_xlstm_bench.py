"""The xLSTM prefill benchmark's code paths on a tiny shape. Checks structure, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import xlstm_bench


def test_smoke_run_times_both_prefills_and_decodes_which_agree(tmp_path):
    out = tmp_path / "xlstm.json"
    results = xlstm_bench.main(["--smoke", "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["prefill_s"]) == {"quill_last", "quill_all", "transformers"}
    assert set(results["decode_ms"]) == {"quill", "transformers"}
    assert results["decode_logits_max_difference"] < 1e-4
