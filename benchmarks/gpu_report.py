"""gpu_bench's figures: the ratios derived from what a run measured, as text and as a Markdown table.

    python -m benchmarks.gpu_report runs/gpu/gpu_bench-*.json     # one table over several runs' shapes

Every derived figure is computed from the measured ones whenever the results are saved, so a run
cut short still has the ratios of the parts it finished.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common.report import num, table


def _get(figures: dict, *keys):
    for key in keys:
        if not isinstance(figures, dict) or key not in figures:
            return None
        figures = figures[key]
    return figures


def summarize(shape: dict) -> dict:
    """The headline figures of one shape's results, with their ratios, from whichever parts are there."""
    rates = {"http": _get(shape, "http", "output_token_throughput"), "engine": _get(shape, "engine", "tokens_per_s"),
             "hf_static": _get(shape, "hf", "static", "tokens_per_s")}
    rates = {k: v for k, v in rates.items() if v is not None}
    ratios = {f"{a}_vs_{b}": rates[a] / rates[b] for a, b in (("http", "engine"), ("http", "hf_static"),
                                                               ("engine", "hf_static")) if a in rates and b in rates}
    batch1 = {"engine": _get(shape, "batch1", "engine", "ms_per_token"),
              "step_loop": _get(shape, "batch1", "step_loop", "ms_per_token"),
              "hf": _get(shape, "hf", "batch1", "ms_per_token")}
    batch1 = {k: v for k, v in batch1.items() if v is not None}
    floor = _get(shape, "batch1", "floor_ms_per_token")
    summary = {"tokens_per_s": rates, "ratios": ratios, "batch1_ms_per_token": batch1,
               "batch1_floor_ms_per_token": floor,
               "batch1_vs_floor": {k: v / floor for k, v in batch1.items()} if floor else {}}
    if "profile" in shape and "busy_ms_per_step" in shape["profile"]:
        p = shape["profile"]
        summary["decode_step"] = {k: p.get(k) for k in ("device", "num_seqs", "wall_ms_per_step",
                                                        "profiled_wall_ms_per_step", "busy", "busy_ms_per_step",
                                                        "kernels_per_step", "cpu_ops_per_step")}
    return summary


def _ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def render_shape(name: str, shape: dict) -> list[str]:
    """One shape's figures as text lines."""
    s = summarize(shape)
    lines = [f"{name}: {_get(shape, 'model', 'description') or ''}"]
    if "model" in shape:
        m = shape["model"]
        lines.append(f"  {m['parameters'] / 1e6:,.0f}M parameters, {m['weight_bytes'] / 2**30:.2f} GiB {m['dtype']}; "
                     f"a decode step reads {m['decode_read_bytes'] / 2**30:.2f} GiB of them")
    rows = []
    labels = {"http": "Quill over HTTP", "engine": "Quill engine in-process", "hf_static": "HF generate, static"}
    for key, rate in s["tokens_per_s"].items():
        note = ""
        if key == "http":
            h = shape["http"]
            note = f"{h['num_ok']} ok; TTFT p50 {_ms(1000 * (h['ttft_s']['p50'] or 0))} ms"
        elif key == "engine":
            e = shape["engine"]
            note = f"{e['preemptions']} preemptions; decode step median {e['decode_step_ms_median']:.1f} ms"
        elif key == "hf_static":
            st = shape["hf"]["static"]
            note = f"batches of {st['batch_size']}; {st['computed_tokens_per_s']:,.0f} incl. padding and overrun"
        rows.append([labels[key], num(rate), note])
    if rows:
        lines += table(["run", "output tokens/s", "note"], rows)
    if s["ratios"]:
        lines.append("  " + "   ".join(f"{k.replace('_vs_', ' / ')}: {v:.2f}x" for k, v in s["ratios"].items()))
    if s["batch1_ms_per_token"]:
        floor = s["batch1_floor_ms_per_token"]
        parts = [f"{k} {v:.2f} ms/token ({s['batch1_vs_floor'][k]:.2f}x floor)" if floor else f"{k} {v:.2f}"
                 for k, v in s["batch1_ms_per_token"].items()]
        lines.append(f"  batch 1: {'; '.join(parts)}; floor {'-' if floor is None else f'{floor:.3g}'} ms")
    if "decode_step" in s:
        d = s["decode_step"]
        launches = f", {d['kernels_per_step']:,.0f} kernels" if d["kernels_per_step"] is not None else ""
        lines.append(f"  decode step at {d['num_seqs']} sequences: {d['wall_ms_per_step']:.2f} ms wall "
                     f"({d['profiled_wall_ms_per_step']:.2f} ms under the profiler); {d['busy_ms_per_step']:.2f} ms "
                     f"{d['busy']}{launches}; {d['cpu_ops_per_step']:,.0f} torch operator calls")
    for part, error in shape.get("errors", {}).items():
        lines.append(f"  {part} FAILED: {error.strip().splitlines()[-1]}")
    return lines


def machine_line(results: dict) -> str:
    d, m = results["device"], results["machine"]
    where = f"{d['name']} ({d['memory_bytes'] / 2**30:.0f} GiB)" if d["type"] == "cuda" else f"CPU: {m['cpu']}"
    bw = _get(results, "limits", "read_bandwidth")
    return (f"{where} | {results['dtype']} | torch {m['torch']} | transformers {m.get('transformers', '-')} | "
            f"read bandwidth {'-' if bw is None else f'{bw / 1e9:,.1f} GB/s'}")


def render(results: dict) -> str:
    lines = [f"Quill on {results['device']['type']}: {results['preset']} run", machine_line(results)]
    for name, shape in results["shapes"].items():
        lines += ["", *render_shape(name, shape)]
    return "\n".join(lines)


def markdown(runs: list[dict]) -> str:
    """One Markdown table over the shapes of several runs (the GPU table of docs/gpu.md)."""
    lines = ["| model shape | Quill over HTTP tokens/s | in-process tokens/s | HTTP / in-process | "
             "HF static batches tokens/s | HTTP / HF | batch-1 ms/token (floor) | "
             "decode step at N seqs: wall / busy ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    machines = []
    for results in runs:
        machines.append(machine_line(results))
        for name, shape in results["shapes"].items():
            s = summarize(shape)
            t, r = s["tokens_per_s"], s["ratios"]
            batch = _get(shape, "hf", "static", "batch_size")
            hf = f"{t['hf_static']:,.0f} (batches of {batch})" if "hf_static" in t else "-"
            b1 = s["batch1_ms_per_token"].get("engine")
            floor = s["batch1_floor_ms_per_token"]
            d = s.get("decode_step")
            step = (f"{d['num_seqs']}: {d['wall_ms_per_step']:.1f} / {d['busy_ms_per_step']:.1f}"
                    + (f" ({d['kernels_per_step']:,.0f} kernels)" if d["kernels_per_step"] is not None else " (CPU)")
                    if d else "-")
            lines.append(" | ".join([
                f"| {_get(shape, 'model', 'description') or name}",
                _ms(t.get("http"), 0), _ms(t.get("engine"), 0),
                f"{r['http_vs_engine']:.0%}" if "http_vs_engine" in r else "-", hf,
                f"{r['http_vs_hf_static']:.2f}x" if "http_vs_hf_static" in r else "-",
                f"{b1:.2f} ({floor:.3g})" if b1 is not None and floor else _ms(b1, 2),
                step + " |",
            ]))
    return "\n".join([*dict.fromkeys(machines), "", *lines])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_report", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="JSON files written by gpu_bench --out")
    parser.add_argument("--text", action="store_true", help="each run's full text report instead of the table")
    args = parser.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in args.files]
    out = "\n\n".join(render(r) for r in runs) if args.text else markdown(runs)
    print(out)
    return out


if __name__ == "__main__":
    main()
