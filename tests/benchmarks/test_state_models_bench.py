"""The Mamba / xLSTM serving benchmark's code paths on tiny shapes. Checks structure, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import state_models_bench


def test_smoke_run_measures_every_contender_both_chats_and_a_decode_step(tmp_path):
    out = tmp_path / "state_models.json"
    results = state_models_bench.main(["--smoke", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["shapes"]) == {"mamba", "xlstm"}
    for shape in results["shapes"].values():
        t = shape["throughput"]
        others = {"quill_prefix_caching_off", "transformers_one_at_a_time", "transformers_static_2",
                  "transformers_static_6"}
        assert set(t["median_tokens_per_s"]) == {"quill", *others}
        assert set(t["ratios"]) == {f"quill_vs_{name}" for name in others}
        for name in others:
            assert t["ratios"][f"quill_vs_{name}"] == t["median_tokens_per_s"]["quill"] / t["median_tokens_per_s"][name]
        assert all(v > 0 for v in t["median_tokens_per_s"].values())
        # every request of the timed runs generated exactly its max_tokens, and Quill's greedy tokens are generate()'s
        assert t["greedy_check"]["equal"] == t["greedy_check"]["requests"] == 2
        c = shape["chat"]
        on, off = c["runs"]["prefix_caching_on"][0], c["runs"]["prefix_caching_off"][0]
        # the second turn resumes from the first's state (its prompt, its answer but the last token) only when on
        turn = c["conversation"]
        assert on["prefix_hit_tokens"] == turn["first_prompt_tokens"] + turn["answer_tokens"] - 1
        assert off["prefix_hit_tokens"] == 0
        assert c["conversation"]["second_prompt_tokens"] == 40 + 4 + 6
        for run in c["runs"]["prefix_caching_on"] + c["runs"]["prefix_caching_off"]:
            assert 0 < run["first_token_s"] <= run["answer_s"]  # the answer's first token comes with or before its last
        d = shape["step"]
        assert set(d["median_ms"]) == {"quill", "transformers"} and all(d["top_ops"].values())
