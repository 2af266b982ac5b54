"""Where a decode step's time goes: the engine stepped with many sequences running, under torch.profiler.

Every prompt is computed first, so each measured step is a pure decode step: one new token for
every running sequence. Wall time per step is taken without the profiler (which slows the host
down); the profiler then records as many steps again, and its trace says what the device did in
them: on a GPU, the kernels, copies and fills it ran, their count and the time it was busy; on the
CPU, which launches no kernels, the time the host spent inside torch operators, which is CPU time
and is reported as such, never as device time.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from quill.server.engine.core import EngineCore

from .hardware import synchronize
from .quill_runs import sampling_params
from .tokenized import TokenizedRequest

# Chrome-trace categories, lower-cased (older Kineto writes "Kernel", "Memcpy", "Operator").
KERNELS = {"kernel"}
COPIES = {"gpu_memcpy", "gpu_memset", "memcpy", "memset"}  # copies and fills the GPU did itself
HOST_OPS = {"cpu_op", "operator"}
TOP_KERNELS = 12  # kernels listed by their time


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: time in which at least one of them ran."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def outermost(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals not nested inside another one (of one thread): top-level operator calls."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
        if not out or start >= out[-1][1]:
            out.append((start, end))
    return out


def _spans(events: list[dict]) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e["dur"]) for e in events]


def summarize_trace(events: list[dict], num_steps: int, on_gpu: bool) -> dict:
    """Per-step figures from a Chrome trace's events (times in microseconds) covering `num_steps` steps."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    category = lambda e: str(e.get("cat", "")).lower()  # noqa: E731
    by_thread = defaultdict(list)
    for e in complete:
        if category(e) in HOST_OPS:
            by_thread[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e["dur"]))
    top_ops = [iv for spans in by_thread.values() for iv in outermost(spans)]
    out = {
        "cpu_ops_per_step": len(top_ops) / num_steps,  # top-level torch operator calls
        "cpu_op_ms_per_step": busy_time(top_ops) / num_steps / 1000,  # host time inside them
    }
    if not on_gpu:
        return out | {"busy": "CPU time inside torch operators (no device kernels on the CPU)",
                      "busy_ms_per_step": out["cpu_op_ms_per_step"]}
    kernels = [e for e in complete if category(e) in KERNELS]
    copies = [e for e in complete if category(e) in COPIES]
    time_by_name, calls_by_name = Counter(), Counter()
    for e in kernels:
        time_by_name[e["name"]] += e["dur"]
        calls_by_name[e["name"]] += 1
    if not kernels:
        out["warning"] = "the trace holds no GPU kernels: the profiler could not trace the device (CUPTI)"
    return out | {
        "busy": "GPU time: kernels, copies and fills (the union of their intervals)",
        "busy_ms_per_step": busy_time(_spans(kernels + copies)) / num_steps / 1000,
        "kernels_per_step": len(kernels) / num_steps,
        "kernel_ms_per_step": sum(e["dur"] for e in kernels) / num_steps / 1000,
        "copies_per_step": len(copies) / num_steps,
        "copy_ms_per_step": sum(e["dur"] for e in copies) / num_steps / 1000,
        "top_kernels": [{"name": name, "ms_per_step": t / num_steps / 1000, "calls_per_step": calls_by_name[name]
                         / num_steps} for name, t in time_by_name.most_common(TOP_KERNELS)],
    }


def decode_budget(prompt_lens: list[int], max_num_batched_tokens: int, steps_after: int) -> int:
    """max_tokens that keeps every sequence running through the prefill of all prompts and `steps_after`
    decode steps: running sequences are scheduled first, one token each, so every prefill step computes
    at least (budget - sequences) prompt tokens, and a sequence decodes in each step after its prompt."""
    spare = max_num_batched_tokens - len(prompt_lens)
    if spare < 1:
        raise ValueError(f"profiling {len(prompt_lens)} decoding sequences needs a step budget above that "
                         f"(max_num_batched_tokens is {max_num_batched_tokens})")
    return -(-sum(prompt_lens) // spare) + 1 + steps_after


def decode_requests(prompts: list[TokenizedRequest], max_num_batched_tokens: int, warm_steps: int,
                    steps: int) -> list[TokenizedRequest]:
    """`prompts` as greedy requests long enough to run through the whole profile (see `decode_budget`)."""
    max_tokens = decode_budget([len(p.prompt_token_ids) for p in prompts], max_num_batched_tokens,
                               warm_steps + 2 * steps + 1)
    return [replace(p, max_tokens=max_tokens, options={"temperature": 0}) for p in prompts]


def _step(engine: EngineCore, num_seqs: int) -> float:
    start = time.perf_counter()
    for out in engine.step():
        if out.error or out.finished:
            raise RuntimeError(f"request {out.request_id} ended during the decode-step profile: {out.error}")
    seconds = time.perf_counter() - start
    stats = engine.last_step
    if stats.num_seqs != num_seqs or stats.num_tokens != num_seqs:
        raise RuntimeError(f"expected a decode step of {num_seqs} sequences, the step ran {stats.num_seqs} "
                           f"sequences and {stats.num_tokens} tokens")
    return seconds


def profile_decode(engine: EngineCore, requests: list[TokenizedRequest], warm_steps: int, steps: int,
                   trace_path: Path | None = None) -> dict:
    """Decode steps of `engine` with every request of `requests` running (from `decode_requests`); see the
    module docstring. `trace_path`: also keep the profiler's Chrome trace there (gzipped if it ends in .gz)."""
    device, num_seqs = engine.loaded.device, len(requests)
    for r in requests:
        engine.add_request(r.request_id, r.prompt_token_ids, sampling_params(r))
    for _ in range(min(r.max_tokens for r in requests)):  # until every prompt is computed
        engine.step()
        if engine.last_step.num_tokens == engine.last_step.num_seqs == num_seqs:
            break
    else:
        raise RuntimeError(f"the {num_seqs} prompts were not all computed before the first request ended")
    for _ in range(warm_steps):
        _step(engine, num_seqs)
    wall = [_step(engine, num_seqs) for _ in range(steps)]

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            _step(engine, num_seqs)
        synchronize(device)
        profiled_seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="quill-trace-") as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        events = json.loads(raw.read_text())["traceEvents"]
        if trace_path is not None:
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            opener = gzip.open if trace_path.suffix == ".gz" else open
            with opener(trace_path, "wb") as f:
                f.write(raw.read_bytes())
    for r in requests:
        engine.abort(r.request_id)

    figures = summarize_trace(events, steps, on_gpu)
    profiled_ms = 1000 * profiled_seconds / steps
    return {
        "device": device.type, "num_seqs": num_seqs, "steps": steps, "warm_steps": warm_steps,
        "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "wall_ms_per_step": 1000 * statistics.median(wall),  # without the profiler
        "wall_ms_per_step_min": 1000 * min(wall),
        "profiled_wall_ms_per_step": profiled_ms,
        **figures,
        "busy_share_of_profiled_wall": figures["busy_ms_per_step"] / profiled_ms,
        "trace": str(trace_path) if trace_path is not None else None,
    }


def top_ops(fn, count: int = 8) -> list[dict]:
    """The operators that took most of one call's time (self CPU time), by torch.profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:count]
    return [{"op": e.key, "ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in ops]
