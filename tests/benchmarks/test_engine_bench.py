"""The benchmark's code paths on tiny models, in seconds. Checks structure, never speed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks.engine_bench import main, run
from benchmarks.common.parts import PARTS
from benchmarks.common.settings import SMOKE
from benchmarks.common.tokenized import spread_subset, tokenize
from quill.clients.bench.workload import TargetModel, WorkloadSpec, build_requests


def test_smoke_suite_runs_every_part(tmp_path, capsys):
    out = tmp_path / "bench.json"
    results = main(["--smoke", "--threads", "1", "--gpt2-vocab", "400", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(PARTS) <= set(results)
    assert {"cpu", "cores", "torch", "torch_threads"} <= set(results["machine"])
    assert results["machine"]["torch_threads"] == 1
    assert results["limits"]["matmul_flops"] > 0 and results["limits"]["read_bandwidth"] > 0

    t = results["throughput"]
    assert t["model"]["config"]["vocab_size"] == results["settings"]["gpt2"]["vocab_size"] == 400
    assert "400-token vocabulary" in t["model"]["source"]
    assert t["quill"]["generated_tokens"] == t["workload"]["generated_tokens"]
    assert t["quill"]["preemptions"] == 0
    assert t["hf_serial"]["extrapolated"] == (SMOKE.hf_serial_subset < SMOKE.num_requests)
    assert t["hf_static"]["computed_tokens"] >= t["hf_static"]["generated_tokens"]
    assert set(t["ratios"]) == {"quill_vs_hf_static", "quill_vs_hf_serial"}

    d = results["decode"]
    for name in ("quill_engine", "quill_step_loop", "hf_generate"):
        assert d[name]["repeats"] == SMOKE.decode_repeats
        assert d[name]["ms_per_token"] > 0 and d[name]["ratio_to_floor"] > 0

    for arch in ("lstm", "gcnn"):
        r = results["recurrent"][arch]
        assert r["model"]["source"] == "tiny random weights"
        assert r["quill"]["generated_tokens"] == r["workload"]["generated_tokens"]
        assert r["model"]["bytes_per_slot"] > 0

    m = results["memory"]
    assert m["kv_bytes_per_token"] == m["kv_bytes_per_token_expected"]
    assert m["all_caches_empty_after"] and len(m["cache_checks"]) == 6

    table = capsys.readouterr().out
    for title in ("1. Transformer throughput", "2. Single-request decode", "3. LSTM and gated CNN", "4. Memory"):
        assert title in table


def test_memory_alone_serves_its_own_requests():
    results = run(SMOKE, ["memory"], log=lambda _: None)
    assert set(PARTS) & set(results) == {"memory"}
    checks = results["memory"]["cache_checks"]
    assert len(checks) == 1 and checks[0]["usage_after"] == 0


def test_workload_is_fixed_by_its_seed_and_subsets_span_it():
    spec = WorkloadSpec(64, (32, 128), (16, 128), models=["m"], prompts="ids")
    targets = {"m": TargetModel(1024, vocab_size=1000)}
    requests = tokenize(build_requests(spec, targets))
    assert requests == tokenize(build_requests(spec, targets))
    assert all(32 <= len(r.prompt_token_ids) <= 128 and 16 <= r.max_tokens <= 128 for r in requests)
    assert all(0 < t < 1000 for r in requests for t in r.prompt_token_ids)
    assert all(r.options == {"temperature": 0} and r.num_returned == 1 for r in requests)
    subset = spread_subset(requests, 8)
    assert len({r.request_id for r in subset}) == 8
    lengths = sorted(r.max_tokens for r in requests)
    assert min(r.max_tokens for r in subset) <= lengths[8] and max(r.max_tokens for r in subset) >= lengths[-9]
