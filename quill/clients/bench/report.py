"""Figures of a bench run: percentiles, throughput, errors by status; the text table and the JSON file."""

from __future__ import annotations

import json
import math
import os
import platform
from collections import Counter
from pathlib import Path

from .runner import RequestResult, RunResult

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile, linearly interpolated between order statistics (numpy's default); None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: list[float]) -> dict:
    """count, mean and the PERCENTILES of a sample (seconds in, seconds out)."""
    out = {"count": len(values), "mean": sum(values) / len(values) if values else None}
    out.update({f"p{q}": percentile(values, q) for q in PERCENTILES})
    return out


def _latencies(ok: list[RequestResult]) -> dict:
    timed = [r for r in ok if not r.answers_at_end]  # beam search has no first token before its last
    return {
        "ttft_s": distribution([r.ttft for r in timed if r.ttft is not None]),
        "itl_s": distribution([g for r in timed for g in r.chunk_gaps]),
        "tpot_s": distribution([r.tpot for r in timed if r.tpot is not None]),
        "e2e_s": distribution([r.latency for r in ok]),
    }


def _breakdown(ok: list[RequestResult], key, seconds: float) -> dict:
    """The same figures per value of `key` (model or strategy); throughput over the whole run's time."""
    out = {}
    for value in sorted({key(r) for r in ok}):
        mine = [r for r in ok if key(r) == value]
        tokens = sum(r.completion_tokens for r in mine)
        out[value] = {"num_ok": len(mine), "completion_tokens": tokens, "output_token_throughput": tokens / seconds,
                      **_latencies(mine)}
    return out


def _encoder_decoders(results: list[RequestResult]) -> dict:
    """Per encoder-decoder model: its requests, and the languages they carried (sorted; [] when none)."""
    out = {}
    for model in sorted({r.model for r in results if r.encoder_decoder}):
        mine = [r for r in results if r.model == model]
        out[model] = {"num_sent": len(mine), "num_ok": sum(r.is_ok for r in mine),
                      "source_langs": sorted({r.source_lang for r in mine if r.source_lang}),
                      "target_langs": sorted({r.target_lang for r in mine if r.target_lang})}
    return out


def summarize(run: RunResult) -> dict:
    ok = [r for r in run.results if r.is_ok]
    completion = sum(r.completion_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    seconds = max(run.elapsed, 1e-9)
    return {
        "concurrency": run.concurrency, "rate": run.rate, "duration_s": run.elapsed,
        "num_sent": len(run.results), "num_ok": len(ok), "num_not_sent": run.num_not_sent,
        "hit_duration_cap": run.hit_duration_cap,
        "errors_by_status": dict(Counter(r.status for r in run.results if not r.is_ok)),
        "request_throughput": len(ok) / seconds,
        "output_token_throughput": completion / seconds,
        "total_token_throughput": (prompt + completion) / seconds,
        "prompt_tokens": prompt, "completion_tokens": completion,
        **_latencies(ok),
        "by_model": _breakdown(ok, lambda r: r.model, seconds),
        "by_strategy": _breakdown(ok, lambda r: r.strategy, seconds),
        "encoder_decoder": _encoder_decoders(run.results),
        "by_target_lang": _breakdown([r for r in ok if r.target_lang], lambda r: r.target_lang, seconds),
    }


def request_records(run: RunResult) -> list[dict]:
    """One small record per request sent (gaps are summarised, not listed)."""
    return [
        {"index": r.index, "model": r.model, "strategy": r.strategy, "status": r.status, "start_s": r.start,
         "ttft_s": None if r.answers_at_end else r.ttft, "e2e_s": r.latency, "tpot_s": r.tpot,
         "itl_mean_s": sum(r.chunk_gaps) / len(r.chunk_gaps) if r.chunk_gaps else None,
         "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "error": r.error,
         **({"source_lang": r.source_lang, "target_lang": r.target_lang} if r.encoder_decoder else {})}
        for r in run.results
    ]


def _codes(codes: list[str], empty: str, shown: int = 8) -> str:
    if not codes:
        return empty
    more = f" and {len(codes) - shown} more" if len(codes) > shown else ""
    return ", ".join(codes[:shown]) + more


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def format_summary(s: dict) -> str:
    load = f"concurrency {s['concurrency']}" if s["rate"] is None else f"Poisson {s['rate']:g} req/s" + (
        f", at most {s['concurrency']} in flight" if s["concurrency"] else "")
    lines = [
        f"{s['num_ok']} of {s['num_sent']} requests ok in {s['duration_s']:.1f} s ({load})"
        + (f"; duration cap reached, {s['num_not_sent']} not sent" if s["hit_duration_cap"] else ""),
        f"throughput: {s['request_throughput']:.2f} req/s, {s['output_token_throughput']:.1f} output tok/s "
        f"({s['total_token_throughput']:.1f} tok/s with prompts)",
        f"{'latency (ms)':<24}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}{'n':>7}",
    ]
    for key, label in [("ttft_s", "time to first token"), ("itl_s", "inter-token"),
                       ("tpot_s", "per output token"), ("e2e_s", "end to end")]:
        d = s[key]
        lines.append(f"  {label:<22}{_ms(d['mean']):>9}{_ms(d['p50']):>9}{_ms(d['p90']):>9}{_ms(d['p99']):>9}"
                     f"{d['count']:>7}")
    if len(s["by_model"]) > 1:
        for model, m in s["by_model"].items():
            lines.append(f"  {model}: {m['num_ok']} ok, {m['output_token_throughput']:.1f} output tok/s, "
                         f"TTFT p50 {_ms(m['ttft_s']['p50'])} ms, inter-token p50 {_ms(m['itl_s']['p50'])} ms, "
                         f"end to end p50 {_ms(m['e2e_s']['p50'])} ms")
    for model, m in s.get("encoder_decoder", {}).items():
        lines.append(f"  {model} (encoder-decoder): {m['num_ok']} of {m['num_sent']} ok, source language "
                     f"{_codes(m['source_langs'], 'not sent')}, target languages {_codes(m['target_langs'], 'none')}")
    errors = s["errors_by_status"]
    lines.append("errors: " + (", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) if errors else "none"))
    return "\n".join(lines)


def machine() -> dict:
    """What ran the bench (client and, on loopback, the server too)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
