"""http_bench's figures side by side: the over-HTTP run against the in-process runs of the same requests.

Every rate is output tokens per second of wall time: the tokens the requests asked for (max_tokens
per returned sequence), not the padding and overrun that static batches compute on top.
"""

from __future__ import annotations

from .hf_runs import StaticBatchRun
from .quill_runs import EngineRun
from .report import model_line, num, steps_note, table
from .timing import TimedRun
from .tokenized import TokenizedRequest, num_generated, num_prompt_tokens


def describe_requests(requests: list[TokenizedRequest]) -> dict:
    """What the drawn workload amounts to, in tokens."""
    prompts = [len(r.prompt_token_ids) for r in requests]
    return {"prompt_tokens": num_prompt_tokens(requests), "generated_tokens": num_generated(requests),
            "prompt_lens_drawn": [min(prompts), max(prompts)],
            "max_tokens_drawn": [min(r.max_tokens for r in requests), max(r.max_tokens for r in requests)]}


def compare(http: dict, engine: EngineRun, static: StaticBatchRun, serial: TimedRun | None) -> dict:
    """The in-process runs, and every ratio against them, from the HTTP run's summary (`clients.bench.report`)."""
    http_tps, engine_tps, static_tps = http["output_token_throughput"], engine.tokens_per_s, static.tokens_per_s
    ratios = {  # this over that, in output tokens/s
        "http_vs_hf_static": http_tps / static_tps,
        "engine_vs_hf_static": engine_tps / static_tps,
        "http_vs_engine": http_tps / engine_tps,
    }
    if serial is not None:
        ratios |= {"http_vs_hf_serial": http_tps / serial.tokens_per_s,
                   "engine_vs_hf_serial": engine_tps / serial.tokens_per_s}
    return {
        "engine": engine.to_dict(),
        "hf_static": static.to_dict(computed_tokens_per_s=static.computed_tokens_per_s),
        "hf_serial": None if serial is None else serial.to_dict(),
        "ratios": ratios,
        # Time per output token the server spends beyond the engine's own (negative: noise or a busy CPU).
        "http_cost_ms_per_token": 1000 * (1 / http_tps - 1 / engine_tps),
        "http_cost_share": 1 - http_tps / engine_tps,
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:,.1f} ms"


def render(r: dict) -> str:
    m, w, h, e, st, se = r["machine"], r["workload"], r["http"], r["engine"], r["hf_static"], r["hf_serial"]
    c = r["settings"]["concurrency"]
    lines = [
        f"Quill over HTTP vs in-process runs of the same requests, same weights ({r['preset']})",
        f"Machine: {m['cpu']} | {m['cores']} cores | torch {m['torch']} | torch threads: {m['torch_threads']} "
        f"| load average (1/5/15 min) {m['load_average']} at start, {m['load_average_end']} at end",
        f"Model: {model_line(r['model'])}; generate() on {r['model']['hf_model']}, max |logit difference| "
        f"{r['model']['max_logit_difference']:.1e}",
        f"Workload: {w['num_requests']} requests, {c} at a time, prompts {w['prompt_lens_drawn'][0]}-"
        f"{w['prompt_lens_drawn'][1]} tokens ({w['prompts']}), max_tokens {w['max_tokens_drawn'][0]}-"
        f"{w['max_tokens_drawn'][1]} ({w['generated_tokens']:,} tokens to generate), mix "
        + ", ".join(f"{k} {v:.0%}" for k, v in w["mix"].items()) + ", streamed, EOS ignored",
        "Server: " + " ".join(r["server"]["command"]),
        "",
    ]
    rows = [
        [f"Quill over HTTP, {c} at a time", num(h["output_token_throughput"]), num(h["duration_s"], 2),
         f"{h['num_ok']} ok; TTFT p50 {_ms(h['ttft_s']['p50'])}, inter-token p50 {_ms(h['itl_s']['p50'])}"],
        [f"Quill engine in-process, {c} at a time", num(e["tokens_per_s"]), num(e["seconds"], 2),
         f"{e['preemptions']} preemptions; " + steps_note(e)],
        [f"HF generate, static batches of {st['batch_size']}", num(st["tokens_per_s"]), num(st["seconds"], 2),
         f"{st['num_batches']} batch{'es' if st['num_batches'] != 1 else ''}, left padded"],
        ["  same, incl. padding and overrun", num(st["computed_tokens_per_s"]), "",
         f"{st['computed_tokens']:,} token positions computed"],
    ]
    if se is not None:
        rows.append(["HF generate, one at a time", num(se["tokens_per_s"]), num(se["seconds"], 2),
                     f"timed on {se['num_requests']} of {w['num_requests']} requests"])
    ratios = r["ratios"]
    lines += table(["run", "output tokens/s", "seconds", "note"], rows)
    lines += [
        "",
        f"Quill over HTTP / HF static batches: {ratios['http_vs_hf_static']:.2f}x   "
        f"Quill engine in-process / HF static batches: {ratios['engine_vs_hf_static']:.2f}x",
    ]
    if "http_vs_hf_serial" in ratios:
        lines.append(f"Quill over HTTP / HF one at a time: {ratios['http_vs_hf_serial']:.2f}x   "
                     f"Quill engine in-process / HF one at a time: {ratios['engine_vs_hf_serial']:.2f}x")
    if r["http_cost_ms_per_token"] > 0:
        lines.append(f"HTTP layer: {r['http_cost_ms_per_token']:.3f} ms per output token beyond the engine's own "
                     f"({r['http_cost_share']:.0%} of the server's time per token; server and client share the CPU)")
    else:
        lines.append("HTTP layer: not measurable here: the server beat the engine driven in-process "
                     f"({-r['http_cost_ms_per_token']:.3f} ms per token faster; noise, or other load on the CPU)")
    return "\n".join(lines)
