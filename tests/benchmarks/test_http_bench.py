"""http_bench end to end on tiny models: a real server, the HTTP run, the in-process runs. Structure, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks.http_bench import main
from benchmarks.common.settings import HTTP_SMOKE


def test_smoke_run_puts_http_beside_the_in_process_runs(tmp_path, capsys):
    out = tmp_path / "http_bench.json"
    results = main(["--smoke", "--threads", "1", "--no-progress", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert {"cpu", "cores", "torch_threads", "load_average", "load_average_end"} <= set(results["machine"])

    w, http = results["workload"], results["http"]
    assert http["num_ok"] == HTTP_SMOKE.num_requests and http["errors_by_status"] == {}
    assert http["completion_tokens"] == w["generated_tokens"]  # exactly max_tokens each, as the server counted
    assert http["prompt_tokens"] == w["prompt_tokens"]  # token-id prompts: exactly what was drawn
    assert results["engine"]["generated_tokens"] == w["generated_tokens"] and results["engine"]["preemptions"] == 0
    assert results["hf_static"]["computed_tokens"] >= results["hf_static"]["generated_tokens"] == w["generated_tokens"]
    assert results["hf_serial"]["num_requests"] == HTTP_SMOKE.hf_serial_subset
    assert set(results["ratios"]) == {"http_vs_hf_static", "engine_vs_hf_static", "http_vs_engine",
                                      "http_vs_hf_serial", "engine_vs_hf_serial"}
    assert all(v > 0 for v in results["ratios"].values())
    assert results["model"]["hf_model"].startswith("GPT2LMHeadModel") and results["model"]["max_logit_difference"] < 1e-4
    assert "--cache-bytes" in results["server"]["command"]

    table = capsys.readouterr().out
    assert "Quill over HTTP / HF static batches:" in table and "HF generate, static batches of 4" in table


def test_a_checkpoint_of_ours_with_text_prompts_and_a_mix(tiny_checkpoints, tmp_path, capsys):
    results = main(["--smoke", "--threads", "1", "--no-progress", "--model", tiny_checkpoints["tiny-transformer"],
                    "--prompts", "text", "--mix", "greedy=0.4,top_p=0.2,beam=0.2,n2=0.2", "--num-requests", "6",
                    "--concurrency", "3", "--serial-requests", "0"])
    assert results["model"]["hf_model"] == "GPT2LMHeadModel rebuilt from our weights"
    assert results["model"]["max_logit_difference"] < 1e-4
    assert results["http"]["num_ok"] == 6 and results["hf_serial"] is None
    # n2 returns two sequences: the server's usage and the in-process runs count both
    assert results["http"]["completion_tokens"] == results["workload"]["generated_tokens"]
    assert results["engine"]["generated_tokens"] == results["workload"]["generated_tokens"]
    assert results["hf_static"]["num_batches"] >= 2  # one setting per batch
    assert "http_vs_hf_serial" not in results["ratios"]
    assert "Quill engine in-process, 3 at a time" in capsys.readouterr().out


def test_a_recurrent_checkpoint_is_refused_before_a_server_starts(tiny_checkpoints):
    with pytest.raises(ValueError, match="needs a Transformer"):
        main(["--smoke", "--no-progress", "--model", tiny_checkpoints["tiny-lstm"]])
