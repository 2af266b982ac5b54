"""gpu_bench on the CPU: the smoke run writes every figure, a stopped or failing part keeps the others', and the
arithmetic behind the bandwidth floor and the decode-step profile. Structure and sums, never speed."""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("transformers")

from benchmarks import gpu_bench, gpu_report
from benchmarks.common.bandwidth_floor import decode_read_bytes, floor_ms_per_token
from benchmarks.common.gpu_settings import SMOKE
from benchmarks.common.server_process import with_serve_args
from benchmarks.common.step_profile import busy_time, decode_budget, outermost, summarize_trace
from quill.models.families.registry import ARCHITECTURES
from quill.server.config import ServerConfig


def quiet(message: str) -> None:
    pass


def test_smoke_run_writes_every_part_of_a_shape(tmp_path, capsys):
    out, traces = tmp_path / "gpu.json", tmp_path / "traces"
    results = gpu_bench.main(["--smoke", "--shapes", "llama3-8b", "--no-progress", "--out", str(out),
                              "--trace-dir", str(traces)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert not out.with_name(out.name + ".partial").exists()
    assert results["device"] == {"type": "cpu"} and results["dtype"] == "float32"
    assert results["limits"]["read_bandwidth"] > 0
    shape = results["shapes"]["llama3-8b"]
    assert shape["errors"] == {} and set(shape["part_seconds"]) == {"checkpoint", *gpu_bench.PARTS}

    model, expected = shape["model"], SMOKE.num_requests
    c = SMOKE.shapes["llama3-8b"].config
    embed_bytes = c["vocab_size"] * c["hidden_size"] * 4
    assert model["decode_read_bytes"] == model["weight_bytes"] - embed_bytes  # untied: the input table is looked up

    engine, http, hf = shape["engine"], shape["http"], shape["hf"]
    assert engine["num_requests"] == expected and engine["preemptions"] == 0 and engine["cache_usage_after"] == 0
    assert http["num_ok"] == expected and http["errors_by_status"] == {}
    assert http["completion_tokens"] == engine["generated_tokens"] == hf["static"]["generated_tokens"]
    assert http["prompt_tokens"] == engine["prompt_tokens"]  # token-id prompts: the same requests everywhere
    assert "--cache-bytes" in http["command"]
    assert hf["max_logit_difference"] < 1e-4 and hf["static"]["batch_size"] == SMOKE.shapes["llama3-8b"].hf_batch_size
    assert hf["static"]["computed_tokens"] >= hf["static"]["generated_tokens"]

    sizing = shape["sizing"]  # on the CPU the server takes its default cache: the part runs, sizing is CUDA's
    assert "--cache-bytes" not in sizing["command"] and sizing["seconds"] == SMOKE.sizing_seconds
    assert sizing["num_ok"] > 0 and sizing["errors_by_status"] == {} and sizing["health_after"] == 200
    assert len(sizing["cache"]) == 1 and "cache reserved" in sizing["cache"][0]
    assert sizing["out_of_memory_in_log"] is False and sizing["device_memory_used_after"] is None

    b1 = shape["batch1"]
    assert b1["floor_ms_per_token"] == pytest.approx(1000 * model["decode_read_bytes"] / results["limits"]
                                                     ["read_bandwidth"])
    for run in (b1["engine"], b1["step_loop"], hf["batch1"]):
        assert run["repeats"] == SMOKE.batch1_repeats and run["ms_per_token"] > 0

    p = shape["profile"]
    assert p["device"] == "cpu" and p["num_seqs"] == SMOKE.profile_seqs and p["steps"] == SMOKE.profile_steps
    assert p["busy"].startswith("CPU time") and "kernels_per_step" not in p  # no GPU figures made up on the CPU
    assert 0 < p["busy_ms_per_step"] <= p["profiled_wall_ms_per_step"] and p["cpu_ops_per_step"] >= 1
    trace = json.loads(gzip.decompress((traces / "llama3-8b-decode-steps.json.gz").read_bytes()))
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])

    s = shape["summary"]
    assert s["tokens_per_s"] == {"http": http["output_token_throughput"], "engine": engine["tokens_per_s"],
                                 "hf_static": hf["static"]["tokens_per_s"]}
    assert s["ratios"]["http_vs_engine"] == pytest.approx(http["output_token_throughput"] / engine["tokens_per_s"])
    assert s["batch1_vs_floor"]["engine"] == pytest.approx(b1["engine"]["ms_per_token"] / b1["floor_ms_per_token"])
    assert "Quill over HTTP" in capsys.readouterr().out
    assert "tiny Llama, untied embeddings" in gpu_report.markdown([results])


def test_server_args_reach_the_in_process_model_and_a_failing_part_leaves_the_others(tmp_path, monkeypatch):
    def broken(run):
        raise RuntimeError("this part broke")

    monkeypatch.setitem(gpu_bench.PARTS, "batch1", broken)
    out = tmp_path / "gpu.json"
    options = gpu_bench.RunOptions(["--attention-backend=sdpa", "--max-num-batched-tokens", "512"], log=quiet)
    results = gpu_bench.run(SMOKE, ["gpt2"], ["batch1", "profile"], out=out, options=options)
    shape = json.loads(out.read_text())["shapes"]["gpt2"]
    assert shape["model"]["attention_backend"] == "sdpa"
    assert "this part broke" in shape["errors"]["batch1"] and set(shape["errors"]) == {"batch1"}
    assert shape["profile"]["busy_ms_per_step"] > 0 and "engine" not in shape
    assert shape["model"]["decode_read_bytes"] == shape["model"]["weight_bytes"] - 64 * 32 * 4  # learned positions
    assert gpu_bench.failed_parts(results) == ["gpt2: batch1"]


def test_a_stopped_part_is_recorded_with_what_came_before(tmp_path, monkeypatch):
    def stopped(run):
        run.record("batch1", floor_ms_per_token=1.0)
        raise KeyboardInterrupt

    monkeypatch.setitem(gpu_bench.PARTS, "batch1", stopped)
    out = tmp_path / "gpu.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_bench.run(SMOKE, ["llama3.2-1b", "gpt2"], ["engine", "batch1"], out=out,
                      options=gpu_bench.RunOptions(log=quiet))
    results = json.loads(out.read_text())
    shape = results["shapes"]["llama3.2-1b"]
    assert shape["engine"]["generated_tokens"] > 0 and shape["batch1"] == {"floor_ms_per_token": 1.0}
    assert shape["errors"]["batch1"].startswith("stopped") and "gpt2" not in results["shapes"]


def test_unknown_server_flags_and_shapes_fail_before_anything_runs():
    with pytest.raises(ValueError, match="no flag --no-such-flag"):
        gpu_bench.run(SMOKE, ["gpt2"], ["engine"], options=gpu_bench.RunOptions(["--no-such-flag"], log=quiet))
    with pytest.raises(ValueError, match="unknown shapes"):
        gpu_bench.run(SMOKE, ["gpt5"], ["engine"], options=gpu_bench.RunOptions(log=quiet))
    with pytest.raises(ValueError, match="max-num-seqs"):
        with_serve_args(ServerConfig(cache_bytes=1), ["--max-num-seqs", "many"])


def test_server_args_apply_on_top_and_the_last_flag_wins():
    base = ServerConfig(models=["m=/x"], cache_bytes=4096, max_num_seqs=256)
    config = with_serve_args(base, ["--max-num-seqs", "8", "--max-num-seqs=16", "--no-prefix-caching"])
    assert config.max_num_seqs == 16 and not config.enable_prefix_caching
    assert config.cache_bytes == 4096 and config.models == ["m=/x"]
    assert with_serve_args(base, []) is base


def test_hf_batch_sizes_for_every_shape_or_each():
    assert gpu_bench.parse_hf_batch_sizes("64", ["gpt2", "llama3-8b"]) == {"gpt2": 64, "llama3-8b": 64}
    assert gpu_bench.parse_hf_batch_sizes("gpt2=128,llama3-8b=32", ["gpt2"]) == {"gpt2": 128, "llama3-8b": 32}
    for bad in ("many", "gpt2=0", "gpt2=x"):
        with pytest.raises(ValueError, match="--hf-batch-size"):
            gpu_bench.parse_hf_batch_sizes(bad, ["gpt2"])


# ---- the arithmetic ------------------------------------------------------------------------


def _transformer(**kwargs):
    config_cls, model_cls = ARCHITECTURES["transformer"]
    return model_cls(config_cls(vocab_size=100, d_model=16, n_layers=1, n_heads=2, **kwargs))


def test_a_decode_step_reads_every_weight_but_the_tables_it_only_looks_up():
    tied, untied = _transformer(), _transformer(tie_embeddings=False)
    total = lambda m: sum(p.numel() * 4 for p in m.parameters())  # noqa: E731
    assert decode_read_bytes(tied) == total(tied)  # the embedding is the output layer: read in full
    assert decode_read_bytes(untied) == total(untied) - 100 * 16 * 4
    learned = _transformer(positional="learned", max_seq_len=32)
    assert decode_read_bytes(learned) == total(learned) - 32 * 16 * 4
    assert floor_ms_per_token(3 * 10**9, 3e12) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        floor_ms_per_token(1, 0)


def test_busy_time_is_the_union_of_intervals():
    assert busy_time([]) == 0
    assert busy_time([(0, 10), (20, 25)]) == 15  # disjoint
    assert busy_time([(0, 10), (5, 15), (12, 14)]) == 15  # overlapping (two streams), and nested
    assert busy_time([(5, 6), (0, 10)]) == 10  # order does not matter
    assert outermost([(0, 10), (1, 2), (3, 9), (10, 12), (11, 12)]) == [(0, 10), (10, 12)]


def _event(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_gpu_trace_gives_kernel_time_launches_and_busy_time_per_step():
    events = [
        _event("cpu_op", "aten::mm", 0, 50), _event("cpu_op", "aten::addmm", 10, 20),  # nested: one call
        _event("cpu_op", "aten::add", 100, 10),
        _event("kernel", "gemm", 0, 400, tid=7), _event("kernel", "gemm", 1000, 400, tid=7),
        _event("kernel", "attn", 200, 400, tid=8),  # another stream, overlapping the first gemm by 200 us
        _event("Memcpy", "Memcpy DtoH", 1500, 100, tid=7),  # an older profiler's category
        {"ph": "i", "cat": "kernel", "name": "not a span", "ts": 5},
    ]
    s = summarize_trace(events, num_steps=2, on_gpu=True)
    assert s["kernels_per_step"] == 1.5 and s["copies_per_step"] == 0.5
    assert s["kernel_ms_per_step"] == pytest.approx(1200 / 2 / 1000)
    assert s["copy_ms_per_step"] == pytest.approx(0.05)
    assert s["busy_ms_per_step"] == pytest.approx((600 + 400 + 100) / 2 / 1000)  # overlap counted once
    assert s["cpu_ops_per_step"] == 1.0 and s["cpu_op_ms_per_step"] == pytest.approx(60 / 2 / 1000)
    assert s["top_kernels"][0] == {"name": "gemm", "ms_per_step": 0.4, "calls_per_step": 1.0}
    assert s["busy"].startswith("GPU time") and "warning" not in s
    blind = summarize_trace([_event("cpu_op", "aten::mm", 0, 50)], num_steps=1, on_gpu=True)
    assert blind["kernels_per_step"] == 0 and "no GPU kernels" in blind["warning"]  # said, not hidden


def test_a_cpu_trace_reports_cpu_time_never_gpu_time():
    events = [_event("cpu_op", "aten::mm", 0, 50), _event("cpu_op", "aten::mm", 20, 60, tid=2)]
    s = summarize_trace(events, num_steps=1, on_gpu=False)
    assert s["busy"].startswith("CPU time") and "kernels_per_step" not in s
    assert s["busy_ms_per_step"] == s["cpu_op_ms_per_step"] == pytest.approx(0.08)  # two threads overlap
    assert s["cpu_ops_per_step"] == 2


def test_the_decode_budget_outlasts_prefill_and_the_profiled_steps():
    # 256 prompts of 272 tokens with a 2,048-token budget: at least 1,792 prompt tokens a step -> 39 steps
    assert decode_budget([272] * 256, 2048, steps_after=26) == 39 + 1 + 26
    with pytest.raises(ValueError, match="step budget"):
        decode_budget([10] * 256, 256, steps_after=5)


def test_summary_ratios_come_from_whichever_parts_ran():
    shape = {"engine": {"tokens_per_s": 200.0}, "http": {"output_token_throughput": 150.0},
             "batch1": {"floor_ms_per_token": 2.0, "engine": {"ms_per_token": 5.0}}}
    s = gpu_report.summarize(shape)
    assert s["ratios"] == {"http_vs_engine": 0.75}
    assert s["batch1_vs_floor"] == {"engine": 2.5} and "decode_step" not in s
    assert gpu_report.summarize({})["ratios"] == {}


@pytest.mark.parametrize("name", ["mamba2-1.3b", "lfm2-1.2b", "lstm"])
def test_state_shapes_run_beside_transformers_or_say_why_not(name, tmp_path):
    """A state family's shape runs its engine and HTTP parts; transformers runs the same weights by its own class
    (logits within float32 rounding), and a bundled LSTM, which transformers has no class for, records why."""
    results = gpu_bench.main(["--smoke", "--shapes", name, "--parts", "engine", "http", "hf", "--no-progress",
                              "--out", str(tmp_path / "gpu.json")])
    shape = results["shapes"][name]
    assert shape["errors"] == {}
    engine, http, hf = shape["engine"], shape["http"], shape["hf"]
    assert http["num_ok"] == engine["num_requests"] == SMOKE.num_requests
    assert http["completion_tokens"] == engine["generated_tokens"] and engine["cache_usage_after"] == 0
    if name == "lstm":
        assert shape["model"]["source"] == "bundled checkpoint shakespeare-lstm"
        assert hf["model"] is None and "no class" in hf["why_none"] and "static" not in hf
    else:
        assert hf["model"].endswith("loaded from the directory") and hf["max_logit_difference"] < 1e-4
        assert hf["static"]["generated_tokens"] == engine["generated_tokens"]
