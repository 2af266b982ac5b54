"""The results dict as a plain-text table, one section per part."""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Aligned columns: the first and last (labels, notes) to the left, the numbers between to the right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    last = len(header) - 1

    def fmt(row: list[str]) -> str:
        cells = [c.ljust(w) if i in (0, last) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return (indent + "  ".join(cells)).rstrip()

    return [fmt(header), indent + "-" * (sum(widths) + 2 * last), *map(fmt, rows)]


def num(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_line(m: dict) -> str:
    return f"{m['source']}, {m['parameters'] / 1e6:.1f}M parameters, {m['weight_bytes'] / 2**20:.0f} MiB {m['dtype']}"


def _workload_line(w: dict) -> str:
    return (f"{w['num_requests']} requests at once, prompts {w['prompt_lens'][0]}-{w['prompt_lens'][1]} tokens, "
            f"max_tokens {w['max_tokens'][0]}-{w['max_tokens'][1]} ({w['generated_tokens']:,} tokens to generate), "
            "greedy, EOS ignored")


def steps_note(run: dict) -> str:
    return (f"{run['steps']} steps; {run['prefill_steps']} with prompt tokens: {run['prefill_step_seconds']:.1f} s; "
            f"decode step median {run['decode_step_ms_median']:,.0f} ms at {run['decode_step_batch_median']:.0f} seqs")


def header(results: dict) -> list[str]:
    m, lim = results["machine"], results["limits"]
    busy = []
    if m["load_average"][0] > m["cores"] / 2:
        busy = [f"WARNING: load average {m['load_average'][0]} on {m['cores']} cores at the start: other work was "
                "using the CPU; if it kept running, these figures understate what the machine can do"]
    return [
        f"Quill engine benchmark ({results['preset']})",
        f"Machine: {m['cpu']} | {m['cores']} cores | torch {m['torch']} | torch threads: {m['torch_threads']} "
        f"| load average (1/5/15 min) {m['load_average']} at start, {m['load_average_end']} at end",
        f"Limits measured in this run: float32 matmul {lim['matmul_size']}^3 {num(lim['matmul_flops'] / 1e9)} GFLOP/s "
        f"(best of {lim['matmul_repeats']}); read bandwidth {num(lim['read_bandwidth'] / 1e9)} GB/s "
        f"(sum of {lim['bandwidth_bytes'] / 2**20:,.0f} MiB float32, best of {lim['bandwidth_repeats']})",
        *busy,
    ]


def throughput(t: dict) -> list[str]:
    q, hs, hb = t["quill"], t["hf_serial"], t["hf_static"]
    serial_note = "all requests"
    if hs["extrapolated"]:
        serial_note = (f"timed on {hs['num_requests']} of {t['workload']['num_requests']} requests, extrapolated "
                       f"(all would take ~{hs['estimated_seconds_all']:.0f} s)")
    rows = [
        ["Quill engine, all submitted at once", num(q["tokens_per_s"]), pct(q["mfu"]), num(q["seconds"], 2),
         f"{q['preemptions']} preemptions; " + steps_note(q)],
        ["  same, MFU counting prompt tokens too", "", pct(q["mfu_all_tokens"]), "",
         f"{q['prompt_tokens']:,} prompt tokens prefilled"],
        ["HF generate, one request at a time", num(hs["tokens_per_s"]), pct(hs["mfu"]), num(hs["seconds"], 2),
         serial_note],
        [f"HF generate, static batches of {hb['batch_size']}", num(hb["tokens_per_s"]), pct(hb["mfu"]),
         num(hb["seconds"], 2), "requested tokens only, left padded"],
        ["  same, incl. padding and overrun", num(hb["computed_tokens_per_s"]), pct(hb["mfu_computed"]), "",
         f"{hb['computed_tokens']:,} token positions computed"],
    ]
    r = t["ratios"]
    return [
        "1. Transformer throughput: " + model_line(t["model"]),
        "   " + _workload_line(t["workload"]),
        *table(["run", "tokens/s", "MFU", "seconds", "note"], rows),
        f"  Quill vs HF static batch: {r['quill_vs_hf_static']:.2f}x   "
        f"Quill vs HF one at a time: {r['quill_vs_hf_serial']:.2f}x",
    ]


def decode(d: dict) -> list[str]:
    names = {"quill_engine": "Quill engine, one request", "quill_step_loop": "Quill model step loop (no engine)",
             "hf_generate": "HF generate"}
    rows = [[label, num(d[k]["ms_per_token"], 2), f"{d[k]['ratio_to_floor']:.2f}x", num(d[k]["first_token_ms"]),
             num(d[k]["total_s"], 2), ""] for k, label in names.items()]
    rows.append(["memory-bandwidth floor", num(d["floor_ms_per_token"], 2), "1.00x", "", "",
                 f"{d['model']['weight_bytes'] / 2**20:,.0f} MiB of weights / read bandwidth"])
    return [
        f"2. Single-request decode: prompt {d['prompt_tokens']} tokens, {d['new_tokens']} new tokens, "
        f"median of {d['quill_engine']['repeats']} run{'s' if d['quill_engine']['repeats'] > 1 else ''}",
        *table(["run", "ms/token", "vs floor", "first token ms", "total s", "note"], rows),
    ]


def recurrent(r: dict) -> list[str]:
    lines = ["3. LSTM and gated CNN: batching vs one request at a time"]
    for arch, x in r.items():
        q, loop, one = x["quill"], x["step_loop_serial"], x["engine_serial"]
        subset = f"timed on {loop['num_requests']} of {q['num_requests']} requests"
        if not loop["extrapolated"]:
            subset = "all requests"
        rows = [
            ["Quill engine, all submitted at once", num(q["tokens_per_s"]), num(q["seconds"], 2), steps_note(q)],
            ["model step loop, one at a time (baseline)", num(loop["tokens_per_s"]), num(loop["seconds"], 2), subset],
            ["Quill engine, one at a time", num(one["tokens_per_s"]), num(one["seconds"], 2), subset],
        ]
        ratios = x["ratios"]
        lines += [
            f"  {arch}: " + model_line(x["model"]),
            "  " + _workload_line(x["workload"]),
            *table(["run", "tokens/s", "seconds", "note"], rows, indent="    "),
            f"    Quill vs step loop: {ratios['quill_vs_step_loop']:.2f}x   "
            f"Quill vs engine one at a time: {ratios['quill_vs_engine_serial']:.2f}x",
        ]
    return lines


def memory(m: dict) -> list[str]:
    rows = [[c["run"], "" if c["peak_usage"] is None else pct(c["peak_usage"]), f"{c['usage_after']:.3f}"]
            for c in m["cache_checks"]]
    return [
        f"4. Memory: GPT-2 K,V cache {m['kv_bytes_per_token']:,} bytes per token "
        f"({m['kv_bytes_per_token'] / 1024:.0f} KiB), {m['kv_bytes_full_context'] / 2**20:.0f} MiB for a full "
        f"{m['max_seq_len']}-token sequence",
        f"   expected {m['kv_bytes_per_token_expected']:,} = {m['kv_bytes_per_token_formula']}",
        *table(["engine run", "peak cache usage", "usage after"], rows),
        f"  every cache back to 0 after its requests finished: {'yes' if m['all_caches_empty_after'] else 'NO'}",
    ]


SECTIONS = {"throughput": throughput, "decode": decode, "recurrent": recurrent, "memory": memory}


def render(results: dict) -> str:
    lines = header(results)
    for name, section in SECTIONS.items():
        if name in results:
            lines += ["", *section(results[name])]
    return "\n".join(lines)
