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
    assert results["greedy_shortlist_median"] > 0 and results["greedy_full_median"] > 0


def test_greedy_only_compares_the_shortlist_with_full_distributions():
    results = fconv_bench.main(["--smoke", "--greedy-only"])
    assert results["greedy_ratio"] > 0 and "concurrent_median" not in results


def test_the_shape_is_the_published_one():
    config = fconv_bench.wikitext103_config()
    assert len(config.layers) == 14 and config.layers[-1] == [2048, 4, 1] and config.embed_dim == 280
    assert config.adaptive_softmax_cutoff == [10000, 20000, 200000, 267_744]
