"""The fconv benchmark's code paths on a 1/64 copy of the WikiText-103 shape. Checks structure, never speed."""

from __future__ import annotations

import json

from benchmarks import fconv_bench


def test_smoke_run_measures_both_concurrencies_and_the_softmax(tmp_path):
    out = tmp_path / "fconv.json"
    results = fconv_bench.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["concurrent_median"] > 0 and results["sequential_median"] > 0 and results["ratio"] > 0
    assert set(results["adaptive_softmax"]) == set(results["decode_step_ms"]) == {1, 64}


def test_the_shape_is_the_published_one():
    config = fconv_bench.wikitext103_config()
    assert len(config.layers) == 14 and config.layers[-1] == [2048, 4, 1] and config.embed_dim == 280
    assert config.adaptive_softmax_cutoff == [10000, 20000, 200000, 267_744]
