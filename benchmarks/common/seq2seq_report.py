"""The seq2seq benchmark's comparisons (whether engines gave the same tokens; throughput at CTranslate2's p99
latency) and its plain-text report."""

from __future__ import annotations

import math
import warnings

from .report import table
from .seq2seq_runs import throughput_within

GOALS = {"transformers": 5.0, "ctranslate2": 0.7}  # Quill's offline rate over each, at least
ONLINE_GOAL = 1.5  # Quill's throughput over CTranslate2's at CTranslate2's p99 latency, at least
KEPT_UP = 0.85  # an online run served at least this share of its arrival rate


def agreement(hf_dir, beams: list[int], outputs: dict, texts: dict) -> dict:
    """By beam width: how many sources CTranslate2 and transformers answered with the same token ids, and how many
    Quill answered with the text transformers' ids (else CTranslate2's) decode to (MarianTokenizer, special tokens
    skipped)."""
    tokenizer, out = None, {}
    for b in beams:
        hf, ct, row = outputs.get(("transformers", b)), outputs.get(("ctranslate2", b)), {}
        if hf is not None and ct is not None:
            row["ctranslate2_vs_transformers"] = {"same": sum(x == y for x, y in zip(hf, ct)), "of": len(hf)}
        reference = hf if hf is not None else ct
        if reference is not None and texts.get(b):
            if tokenizer is None:
                from transformers import AutoTokenizer

                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*sacremoses.*")
                    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
            decoded = tokenizer.batch_decode(reference, skip_special_tokens=True)
            row["quill_text_vs_" + ("transformers" if hf is not None else "ctranslate2")] = {
                "same": sum(x == y for x, y in zip(decoded, texts[b])), "of": len(decoded)}
        out[b] = row
    return out


def online_budget(ct2: list[dict], quill: list[dict]) -> dict:
    """The latency budget: CTranslate2's p99 at the highest rate it kept up with (served >= 85% of the arrival rate,
    every request answered), else at its lowest rate; and the throughput each engine reaches within it."""
    if not ct2:
        return {"budget_s": None}
    kept = [r for r in ct2 if r["finished"] == r["requests"] and r["sentences_per_s"] >= KEPT_UP * r["rate"]]
    reference = max(kept, key=lambda r: r["rate"]) if kept else min(ct2, key=lambda r: r["rate"])
    budget = reference["p99_s"]
    at = {"ctranslate2": dict(zip(("sentences_per_s", "how"), throughput_within(ct2, budget)))}
    if quill:
        at["quill"] = dict(zip(("sentences_per_s", "how"), throughput_within(quill, budget)))
    ratio = None
    if "quill" in at and at["ctranslate2"]["sentences_per_s"] > 0:
        ratio = at["quill"]["sentences_per_s"] / at["ctranslate2"]["sentences_per_s"]
    return {"budget_s": budget, "budget_rate": reference["rate"], "ctranslate2_kept_up": bool(kept),
            "at_budget": at, "ratio": ratio}


def _num(x, digits: int = 1) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b or "tokens_per_s" not in a or "tokens_per_s" not in b:
        return None
    return a["tokens_per_s"] / b["tokens_per_s"]


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def _offline(results: dict) -> list[str]:
    s, w, off = results["settings"], results["workload"], results["offline"]
    rows = []
    for b in results["beams"]:
        for engine in results["engines"]:
            f = off.get(engine, {}).get(b)
            if f is None or "error" in f:
                note = f["error"] if f else "not run: " + results["quill"].get("reason", "")
                rows.append([engine, str(b), "n/a", "n/a", "", note[:200]])
            else:
                note = {"transformers": f"static batches of {s['batch_size']}, right-padded",
                        "ctranslate2": f"translate_batch, max_batch_size {s['batch_size']}",
                        "quill": f"HTTP, {s['concurrency']} in flight"}[engine]
                rows.append([engine, str(b), _num(f["tokens_per_s"]), _num(f["sentences_per_s"], 2),
                             _num(f["seconds"], 2), note])
    lines = [f"Offline: {w['sources']} sources (a set per beam width) of {w['source_lens'][0]}-{w['source_lens'][1]} "
             f"token ids (</s> included), {w['new_tokens']} new tokens each ({w['generated_tokens_per_run']:,} per "
             f"run), {results['model']['dtype']}, {_where(results)}",
             *table(["engine", "beams", "tokens/s", "sentences/s", "seconds", "note"], rows)]
    for b in results["beams"]:
        q, hf, ct = (off.get(e, {}).get(b) for e in ("quill", "transformers", "ctranslate2"))
        quill = (f"Quill / transformers {_x(_ratio(q, hf))} (goal >= {GOALS['transformers']:g}x); Quill / CTranslate2 "
                 f"{_x(_ratio(q, ct))} (goal >= {GOALS['ctranslate2']:g}x); ") if "quill" in results["engines"] else ""
        lines.append(f"  beams {b}: {quill}CTranslate2 / transformers {_x(_ratio(ct, hf))}")
        for name, a in results["agreement"].get(b, {}).items():
            what = name.replace("_vs_", " vs ").replace("_", " ")
            lines.append(f"           same output, {what}: {a['same']} of {a['of']}")
    return lines


def _online(o: dict) -> list[str]:
    rows = []
    for engine in ("ctranslate2", "quill"):
        for r in o["runs"][engine]:
            notes = [f"mean batch {r['mean_batch']:.1f}"] if "mean_batch" in r else []
            if r["finished"] < r["requests"]:
                notes.insert(0, f"{r['requests'] - r['finished']} unanswered {r['drain_cap_s']:g} s after the "
                                "last arrival")
            note = "; ".join(notes)
            rows.append([engine, _num(r["rate"], 2), str(r["requests"]), _num(r["sentences_per_s"], 2),
                         _num(r["tokens_per_s"]), _num(r["p50_s"], 2), _num(r["p99_s"], 2), note])
    lines = ["Online: greedy, Poisson arrivals, answers not streamed; CTranslate2 behind a micro-batching thread",
             *table(["engine", "rate/s", "requests", "sentences/s", "tokens/s", "p50 s", "p99 s", "note"], rows)]
    if "quill" in o.get("errors", {}):
        lines.append(f"  Quill online: {o['errors']['quill']}")
    if o.get("budget_s") is None:
        return lines
    kept = "the highest rate it kept up with" if o["ctranslate2_kept_up"] else "its lowest rate (it kept up with none)"
    budget = o["budget_s"]
    lines.append(f"  budget: CTranslate2's p99 at {kept}, {o['budget_rate']:.2f}/s: "
                 f"{'inf' if math.isinf(budget) else f'{budget:.2f} s'}")
    for engine, a in o["at_budget"].items():
        how = f" ({a['how']})" if a["how"] else ""
        lines.append(f"    {engine}: {a['sentences_per_s']:.2f} sentences/s within it{how}")
    lines.append(f"  Quill / CTranslate2 at that p99: {_x(o['ratio'])} (goal >= {ONLINE_GOAL:g}x)")
    return lines


def _where(results: dict) -> str:
    device = results["machine"].get("device", {"type": "cpu"})
    if device["type"] == "cpu":
        return f"{results['threads']} thread(s) per engine"
    return f"every engine on {device['name']}"


def _gpu(machine: dict) -> str:
    device = machine.get("device", {"type": "cpu"})
    return "" if device["type"] == "cpu" else f"{device['name']} (CUDA {device['cuda']}) | "


def render(results: dict) -> str:
    m, q = results["machine"], results["quill"]
    lines = [f"Seq2seq benchmark ({results['preset']}): {results['model']['description']}, "
             f"{results['model']['parameters'] / 1e6:.1f}M parameters, {results['model']['dtype']}",
             f"Machine: {m['cpu']} | {m['cores']} cores | torch {m['torch']} | transformers {m['transformers']} | "
             f"ctranslate2 {m['ctranslate2']} | {_gpu(m)}load average {m['load_average']} at start, "
             f"{m.get('load_average_end')} at end"]
    if m["load_average"][0] > m["cores"] / 2:  # at the start: at the end it counts this run's own threads
        lines.append(f"WARNING: load average {m['load_average'][0]} on {m['cores']} cores at the start: other work "
                     "was using the CPU, and it slows engines unequally (transformers' threads most); compare figures "
                     "from a quiet machine")
    if "quill" in results["engines"] and not q["ran"]:
        kind = "REFUSED the checkpoint" if q.get("refused") else "did not run"
        lines.append(f"Quill {kind}: {q.get('reason') or 'see the errors below'} (no Quill figures)")
    lines += ["", *_offline(results)]
    if "online" in results:
        lines += ["", *_online(results["online"])]
    return "\n".join(lines)
