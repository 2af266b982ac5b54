"""`--baseline hf`: the HTTP run's workload again, in-process, beside the over-HTTP figures.

Three in-process runs on the checkpoint the server hosts: Quill's engine at the same
concurrency (the difference to the server is the HTTP layer's cost per token), and
Hugging Face `generate()` one request at a time and in static left-padded batches.
They run after the HTTP run, so they do not compete with the server for the cores.
"""

from __future__ import annotations

from pathlib import Path

from models.checkpoint import load_checkpoint, resolve_checkpoint_path

from .baseline_engine import run_engine
from .baseline_hf import BaselineItem, hf_model_for, max_logit_difference, run_serial, run_static_batches
from .workload import BenchRequest


def checkpoint_for(model_id: str, given: str | None) -> Path:
    path = Path(given) if given else resolve_checkpoint_path(model_id)
    if not path.is_dir():
        raise ValueError(f"no checkpoint directory for {model_id!r} here: pass --baseline-checkpoint PATH "
                         "(the directory the server loaded it from)")
    return path


def _spread(items: list, count: int) -> list:
    """`count` items spread evenly over the list (all of them if count is larger)."""
    if count >= len(items):
        return items
    return [items[round(i * (len(items) - 1) / max(1, count - 1))] for i in range(count)]


def run_baselines(checkpoint: Path, requests: list[BenchRequest], http_summary: dict, concurrency: int,
                  device: str = "auto", serial_limit: int = 16, log=print) -> dict:
    loaded = load_checkpoint(checkpoint, device=device)
    items = [BaselineItem(loaded.tokenizer.encode(r.prompt), r.max_tokens, r.strategy.options) for r in requests]
    pad_id = loaded.eos_token_ids[0] if loaded.eos_token_ids else 0
    hf_model, how = hf_model_for(loaded)
    difference = max_logit_difference(loaded, hf_model)
    log(f"baseline: {how} ({loaded.num_parameters / 1e6:.1f}M parameters, {str(loaded.dtype).removeprefix('torch.')} "
        f"on {loaded.device}); max |logit difference| to Quill's model {difference:.2e}")
    log(f"baseline: Quill engine in-process, {len(items)} requests, {concurrency} at a time ...")
    engine = run_engine(loaded, items, concurrency, ignore_eos=True)
    serial_items = _spread(items, serial_limit)
    log(f"baseline: HF generate one at a time, {len(serial_items)} of the {len(items)} requests ...")
    serial = run_serial(hf_model, serial_items, ignore_eos=True, pad_id=pad_id)
    log(f"baseline: HF generate in static batches of {concurrency} ...")
    static = run_static_batches(hf_model, items, concurrency, ignore_eos=True, pad_id=pad_id)
    http_tps = http_summary["output_token_throughput"]
    engine_tps = engine["output_token_throughput"]
    return {
        "checkpoint": str(checkpoint), "hf_model": how, "max_logit_difference": difference,
        "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."),
        "http": {"output_token_throughput": http_tps, "concurrency": concurrency,
                 "num_requests": http_summary["num_ok"]},
        "engine_in_process": engine, "hf_serial": serial, "hf_static_batches": static,
        "ratios": {  # Quill over HTTP divided by each in-process run's output tokens/s
            "http_vs_engine": http_tps / engine_tps,
            "http_vs_hf_serial": http_tps / serial["output_token_throughput"],
            "http_vs_hf_static": http_tps / static["output_token_throughput"],
            "engine_vs_hf_serial": engine_tps / serial["output_token_throughput"],
            "engine_vs_hf_static": engine_tps / static["output_token_throughput"],
        },
        # Time per output token that the server spends beyond the engine's own (negative: noise or a busy CPU).
        "http_cost_ms_per_token": 1000 * (1 / http_tps - 1 / engine_tps),
        "http_cost_share": 1 - http_tps / engine_tps,
    }


def format_baseline(b: dict) -> str:
    c = b["http"]["concurrency"]
    rows = [
        (f"Quill over HTTP, concurrency {c}", b["http"]["output_token_throughput"]),
        (f"Quill engine in-process, {c} at a time", b["engine_in_process"]["output_token_throughput"]),
        (f"HF generate, one at a time ({b['hf_serial']['num_requests']} req)",
         b["hf_serial"]["output_token_throughput"]),
        (f"HF generate, static batches of {b['hf_static_batches']['batch_size']}",
         b["hf_static_batches"]["output_token_throughput"]),
    ]
    http = rows[0][1]
    lines = [f"{'same workload, output tokens/s':<46}{'tok/s':>10}{'HTTP / this':>13}"]
    lines += [f"  {name:<44}{tps:>10.1f}{http / tps:>12.2f}x" for name, tps in rows]
    s = b["hf_static_batches"]
    lines.append(f"  (static batches computed {s['computed_tokens']} tokens for the {s['output_tokens']} asked for: "
                 "padding to each batch's longest request)")
    if b["http_cost_ms_per_token"] > 0:
        lines.append(f"HTTP layer: {b['http_cost_ms_per_token']:.3f} ms per output token beyond the engine's own "
                     f"({b['http_cost_share']:.0%} of the server's time per token)")
    else:
        lines.append("HTTP layer: not measurable here: the server beat the engine driven in-process "
                     f"({-b['http_cost_ms_per_token']:.3f} ms per token faster; noise, or other load on the CPU)")
    return "\n".join(lines)
