"""Mamba and xLSTM served by Quill on the CPU, beside transformers `generate()` on the same random weights, in one
run: 64 concurrent requests (Quill's engine against `generate()` one at a time and in static batches), and a
multi-turn chat whose second turn resumes from the first's saved state (prefix caching on against off).

    python -m benchmarks.state_models_bench --threads 2 --out runs/state_models.json   # both shapes, ~15 min on 2 cores
    python -m benchmarks.state_models_bench --shapes xlstm --parts chat step --threads 1  # some shapes and parts
    python -m benchmarks.state_models_bench --repeats 3 --serial-requests 8            # steadier medians, ~22 min
    python -m benchmarks.state_models_bench --smoke                                     # seconds: tiny shapes

Shapes (random weights, float32; built with transformers' classes, saved with `save_pretrained` beside a byte-level
tokenizer.json, loaded by Quill with `load_checkpoint` and run by transformers as the model object that saved them):
- `mamba`: state-spaces/mamba-130m-hf's shape, `MambaForCausalLM` (hidden 768, 24 layers, state 16, expand 2,
  conv 4, vocabulary 50,280, tied embeddings);
- `xlstm`: a 125M-class `xLSTMForCausalLM` with xLSTM-7b's structure (embedding 768, 12 blocks, 4 heads,
  qk_dim_factor 0.5, v_dim_factor 1, feed-forward 2.667 -> 2,048, xLSTM-7b's vocabulary of 50,304, untied head);
  input and forget gates drawn at random (transformers starts them at zero weights).

Parts (`--parts`):
- `throughput`: 64 requests from a seed, random token-id prompts of 16-128 tokens, max_tokens 16-128, greedy, EOS
  ignored (every request generates exactly max_tokens), the same requests for every contender. Quill: all 64
  submitted at once to one engine (max_num_seqs 64), with prefix caching on (the default) and off, a fresh engine
  each run, warmed on other prompts. transformers: `generate()` one request at a time (`--serial-requests` of the 64,
  4 by default, spread over the max_tokens range: a rate per token), and static batches of 8 and of 64: the requests
  sorted by prompt length, then cut into batches, so that a batch's prompts are alike and left-padding is short; each
  batch runs to its longest max_tokens. Of the 8 batches of 8, 4 spread over the prompt lengths are timed (their
  rate stands for all 8). transformers' Mamba zeroes padded positions by the attention mask; its xLSTM takes no mask
  and runs the pad tokens as input: either way, the padding, and the positions computed past a row's max_tokens, are
  part of what static batching costs and are timed. Output tokens/s counts the tokens asked for.
  Sanity: the greedy tokens of the requests transformers ran one at a time, against Quill's for the same requests
  (which it ran 64 at once).
- `chat`: a conversation whose first turn is a `--chat-prompt`-token prompt (2,000) answered with 32 tokens; the
  second turn's prompt is the first's, its answer and 50 new tokens. Time to the first token of the second turn, and
  to its whole answer (32 tokens), with prefix caching on and off, each on a fresh engine (`quill serve`'s scheduler
  defaults) warmed on another prompt first; on, off, on, off, ... `--chat-repeats` times (3). Both must give the
  same answer.
- `step`: where the time goes: one decode step of 64 sequences, Quill's model step (the engine's forward pass,
  without scheduling and sampling) against transformers' forward of one token a row with its cache (what every step
  of `generate()` runs); medians of 5 in turn, and the operators that took most of one profiled step of each.

Every part runs its contenders in turn each repeat (Quill, transformers, Quill, ...), so that other work on a shared
machine slows them alike (throughput reverses the order every other repeat, so that the process's first run, which
maps its memory afresh, is not always Quill's); figures are medians over the repeats (`--repeats`, 2 by default, to keep a run near 15
minutes), ratios are ratios of medians. `--threads` sets `torch.set_num_threads` for both sides.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from quill.clients.bench.workload import TargetModel, WorkloadSpec, build_requests
from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import LoadedModel, load_checkpoint
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig

from . import mamba_prefill
from .common import hf_runs, quill_runs
from .common.checkpoints import save_random_model
from .common.hardware import describe_machine, load_average
from .common.step_profile import top_ops
from .common.timing import interleaved_runs, interleaved_times, write_json
from .common.tokenized import TokenizedRequest, num_generated, num_prompt_tokens, spread, spread_subset, tokenize

# The tokenizer's end-of-text, which save_random_model makes pad, BOS and EOS: never in a prompt (prompts are ids 1
# and up), never a stop (EOS ignored).
PAD_ID = 0

# name (a family of checkpoints.HF_FAMILIES) -> config keyword arguments
SHAPES = {
    "mamba": mamba_prefill.SHAPE_130M,
    "xlstm": dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_heads=4, qk_dim_factor=0.5,
                  v_dim_factor=1.0),
}
SMOKE_SHAPES = {
    "mamba": mamba_prefill.SHAPE_TINY,
    # 128 wide: transformers' xLSTM cache rounds q/k widths up to 64
    "xlstm": dict(vocab_size=300, hidden_size=128, num_hidden_layers=2, num_heads=4, chunk_size=8),
}
PARTS = ("throughput", "chat", "step")


@dataclass(frozen=True)
class Settings:
    requests: int = 64
    prompt_len: tuple[int, int] = (16, 128)
    max_tokens: tuple[int, int] = (16, 128)
    serial_requests: int = 4  # of the 64, through generate() one at a time (a rate per token)
    batch_sizes: tuple[int, ...] = (8, 64)
    max_static_batches: int = 4  # of a static-batch run's batches, at most this many timed (spread over them)
    repeats: int = 2  # throughput (each repeat: ~3.5 minutes a shape on 2 cores)
    chat_prompt: int = 2000
    chat_answer: int = 32
    chat_new: int = 50
    chat_repeats: int = 3
    step_rows: int = 64  # the decode step part: sequences in the step
    step_prompt: int = 16  # their prompts' tokens (a decode step costs the same after any number)
    step_repeats: int = 5
    seed: int = 0


SMOKE = Settings(requests=6, prompt_len=(3, 10), max_tokens=(2, 6), serial_requests=2, batch_sizes=(2, 6),
                 max_static_batches=2, repeats=1, chat_prompt=40, chat_answer=4, chat_new=6, chat_repeats=1,
                 step_rows=3, step_prompt=5, step_repeats=1)


# ---- models ---------------------------------------------------------------------------------


def build(shape: str, smoke: bool, directory: Path) -> tuple[object, LoadedModel]:
    """(transformers' model, Quill's load of the same directory)."""
    kwargs = SMOKE_SHAPES[shape] if smoke else SHAPES[shape]
    reference = save_random_model(directory, shape, kwargs)
    return reference, load_checkpoint(directory, device="cpu", dtype="float32", name=f"{shape}-random")


# ---- workloads -----------------------------------------------------------------------------


def workload(s: Settings, vocab_size: int, salt: int = 0, **changes) -> list[TokenizedRequest]:
    """The throughput requests (greedy, token-id prompts, EOS ignored); `salt` draws other ones (warm-ups)."""
    spec = replace(WorkloadSpec(s.requests, s.prompt_len, s.max_tokens, models=["bench"], seed=s.seed,
                                prompts="ids"), **changes)
    target = TargetModel(s.prompt_len[1] + s.max_tokens[1] + 2, vocab_size=vocab_size)
    return tokenize(build_requests(spec, {"bench": target}, salt), tag=f"s{salt}-r")


def engine(loaded: LoadedModel, prefix_caching: bool, max_num_seqs: int | None = None) -> EngineCore:
    """A fresh engine with `quill serve`'s defaults but for prefix caching (and the number of sequences)."""
    scheduler = SchedulerConfig() if max_num_seqs is None else SchedulerConfig(max_num_seqs=max_num_seqs)
    return EngineCore(loaded, EngineConfig(scheduler, CacheConfig(enable_prefix_caching=prefix_caching)))


def describe_result(result) -> str:
    if isinstance(result, dict) and "tokens_per_s" in result:
        return f"{result['tokens_per_s']:.1f} output tokens/s in {result['seconds']:.1f} s " \
               f"({result.get('minor_page_faults', 0):,} minor page faults)"
    if isinstance(result, dict) and "first_token_s" in result:
        return f"second turn: first token after {1e3 * result['first_token_s']:.0f} ms, answer after " \
               f"{result['answer_s']:.2f} s ({result['prefix_hit_tokens']} prompt tokens resumed)"
    return str(result)


# ---- part 1: throughput --------------------------------------------------------------------


def throughput(s: Settings, reference, loaded: LoadedModel, log) -> dict:
    vocab = loaded.model.config.vocab_size
    requests = workload(s, vocab)
    warmup = workload(s, vocab, salt=1, num_requests=min(4, s.requests), max_tokens=(2, 2))
    serial_subset = spread_subset(requests, s.serial_requests)
    by_length = sorted(requests, key=lambda r: len(r.prompt_token_ids))  # static batches of alike prompts
    quill_tokens: dict[str, list[int]] = {}
    hf_tokens: dict[str, list[int]] = {}

    def quill(prefix_caching: bool):
        def run() -> dict:
            core = engine(loaded, prefix_caching, max_num_seqs=s.requests)
            tokens: dict[str, list[int]] = {}
            out = quill_runs.engine_throughput(core, requests, warmup, tokens=tokens)
            if prefix_caching and not quill_tokens:
                quill_tokens.update(tokens)
            if core.cache.usage != 0:
                raise RuntimeError(f"cache usage {core.cache.usage} after every request finished")
            return out.to_dict(prefix_hit_tokens=core.cache.prefix_hits)
        return run

    def static(batch_size: int):
        batches = [by_length[i:i + batch_size] for i in range(0, len(by_length), batch_size)]
        timed = [r for batch in spread(batches, s.max_static_batches) for r in batch]
        return lambda: hf_runs.static_batches(reference, timed, batch_size, PAD_ID).to_dict(
            of_batches=len(batches))

    contenders = {"quill": quill(True)}
    contenders |= {f"transformers_static_{b}": static(b) for b in s.batch_sizes}
    contenders["quill_prefix_caching_off"] = quill(False)
    contenders["transformers_one_at_a_time"] = lambda: hf_runs.serial(reference, serial_subset, PAD_ID,
                                                                      tokens=hf_tokens).to_dict()
    runs = interleaved_runs(contenders, s.repeats, log, describe_result)
    medians = {name: statistics.median(r["tokens_per_s"] for r in results) for name, results in runs.items()}
    ratios = {f"quill_vs_{name}": medians["quill"] / median for name, median in medians.items() if name != "quill"}
    return {
        "workload": {"requests": len(requests), "prompt_len": list(s.prompt_len), "max_tokens": list(s.max_tokens),
                     "static_batches_timed": {b: min(s.max_static_batches, -(-len(requests) // b))
                                              for b in s.batch_sizes},
                     "output_tokens": num_generated(requests),
                     "prompt_tokens": num_prompt_tokens(requests),
                     "serial_requests": [r.request_id for r in serial_subset], "seed": s.seed},
        "runs": runs, "median_tokens_per_s": medians, "ratios": ratios,
        "greedy_check": greedy_check(serial_subset, quill_tokens, hf_tokens),
    }


def greedy_check(requests: list[TokenizedRequest], quill: dict, hf: dict) -> dict:
    """Quill's greedy tokens (64 at once) against transformers' (one at a time, no padding), request by request."""
    per_request = {}
    for r in requests:
        ours, theirs = quill[r.request_id], hf[r.request_id]
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        per_request[r.request_id] = {"tokens": len(theirs), "equal": ours == theirs, "first_difference": first,
                                     "distinct_tokens": len(set(theirs))}
    return {"requests": len(per_request), "equal": sum(v["equal"] for v in per_request.values()),
            "per_request": per_request}


# ---- part 2: a chat's second turn ----------------------------------------------------------


def timed_turn(core: EngineCore, request_id: str, prompt: list[int], max_tokens: int) -> dict:
    """Run one greedy request alone to its end: seconds to its first token and to its last, its tokens."""
    hits_before = core.cache.prefix_hits
    tokens: dict[str, list[int]] = {}
    arrivals: list[float] = []
    start = time.perf_counter()
    quill_runs.drive(core, [TokenizedRequest(request_id, prompt, max_tokens, {"temperature": 0})],
                     on_tokens=lambda: arrivals.append(time.perf_counter()), tokens=tokens)
    return {"first_token_s": arrivals[0] - start, "answer_s": time.perf_counter() - start,
            "tokens": tokens[request_id], "prefix_hit_tokens": core.cache.prefix_hits - hits_before}


def chat(s: Settings, loaded: LoadedModel, log) -> dict:
    vocab = loaded.model.config.vocab_size
    rng = torch.Generator().manual_seed(s.seed + 7)
    first_prompt = torch.randint(1, vocab, (s.chat_prompt,), generator=rng).tolist()
    new_tokens = torch.randint(1, vocab, (s.chat_new,), generator=rng).tolist()
    warm_prompt = torch.randint(1, vocab, (64,), generator=rng).tolist()

    def conversation(prefix_caching: bool):
        def run() -> dict:
            core = engine(loaded, prefix_caching)
            timed_turn(core, "warm-up", warm_prompt, 4)  # a prefill chunk and decode steps, on another prompt
            turn1 = timed_turn(core, "turn-1", first_prompt, s.chat_answer)
            second_prompt = first_prompt + turn1["tokens"] + new_tokens
            turn2 = timed_turn(core, "turn-2", second_prompt, s.chat_answer)
            return {"first_token_s": turn2["first_token_s"], "answer_s": turn2["answer_s"],
                    "prefix_hit_tokens": turn2["prefix_hit_tokens"], "second_prompt_tokens": len(second_prompt),
                    "turn1_first_token_s": turn1["first_token_s"], "turn1_answer_s": turn1["answer_s"],
                    "answer": turn2["tokens"]}
        return run

    runs = interleaved_runs({"prefix_caching_on": conversation(True), "prefix_caching_off": conversation(False)},
                            s.chat_repeats, log, describe_result)
    on, off = runs["prefix_caching_on"], runs["prefix_caching_off"]
    if any(r["answer"] != on[0]["answer"] for r in on + off):
        raise RuntimeError("the second turn's answer differs between runs: resuming changed the result")
    for r in on + off:
        del r["answer"]
    med = {name: {key: statistics.median(r[key] for r in results) for key in ("first_token_s", "answer_s")}
           for name, results in runs.items()}
    return {
        "conversation": {"first_prompt_tokens": s.chat_prompt, "answer_tokens": s.chat_answer,
                         "new_tokens": s.chat_new, "second_prompt_tokens": on[0]["second_prompt_tokens"]},
        "runs": runs, "medians": med,
        "first_token_speedup": med["prefix_caching_off"]["first_token_s"] / med["prefix_caching_on"]["first_token_s"],
        "answer_speedup": med["prefix_caching_off"]["answer_s"] / med["prefix_caching_on"]["answer_s"],
    }


# ---- part 3: one decode step, where the time goes ----------------------------------------------


def decode_step(s: Settings, reference, loaded: LoadedModel, log) -> dict:
    """One decode step of `step_rows` sequences whose `step_prompt`-token prompts were run first: Quill's model
    step (the engine's forward pass, without scheduling or sampling) against transformers' forward of one token a
    row with its cache (what each step of `generate()` runs), in turn each repeat; then one profiled step of each.
    Each call advances its state: a decode step costs the same at any position."""
    rows, vocab = s.step_rows, loaded.model.config.vocab_size
    g = torch.Generator().manual_seed(s.seed + 11)
    prompts = torch.randint(1, vocab, (rows, s.step_prompt), generator=g)
    token = torch.randint(1, vocab, (rows, 1), generator=g)
    model, slots = loaded.model, list(range(rows))
    state = model.new_state(rows)
    model.step(StepBatch.build(prompts.tolist(), [0] * rows, slots=slots), state)
    batch = StepBatch.build(token.tolist(), [s.step_prompt] * rows, slots=slots)
    with torch.no_grad():
        cache = reference(prompts, use_cache=True).cache_params

    def hf():
        with torch.no_grad():
            return reference(token, cache_params=cache, use_cache=True).logits

    contenders = {"quill": lambda: model.step(batch, state), "transformers": hf}
    times = interleaved_times(contenders, s.step_repeats)
    ms = {name: [1e3 * seconds for seconds in t["wall"]] for name, t in times.items()}
    medians = {name: statistics.median(t) for name, t in ms.items()}
    log(f"  decode step of {rows}: " + ", ".join(f"{name} {m:.0f} ms" for name, m in medians.items()))
    return {"rows": rows, "prompt_tokens": s.step_prompt, "ms": ms, "median_ms": medians,
            "transformers_vs_quill": medians["transformers"] / medians["quill"],
            "top_ops": {name: top_ops(fn) for name, fn in contenders.items()}}


# ---- the run -----------------------------------------------------------------------------


def run(args: argparse.Namespace, log=print) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    s = SMOKE if args.smoke else Settings()
    s = replace(s, **{k: v for k, v in dict(
        repeats=args.repeats, chat_repeats=args.chat_repeats, serial_requests=args.serial_requests,
        chat_prompt=args.chat_prompt).items() if v is not None})
    results = {"machine": describe_machine(), "load_average_start": load_average(), "settings": asdict(s),
               "smoke": args.smoke, "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
               "shapes": {}}
    log(f"{results['machine']['cpu']}, {results['machine']['cores']} cores, torch {results['machine']['torch']} "
        f"with {torch.get_num_threads()} threads, load average {results['load_average_start']}")
    for shape in args.shapes:
        with tempfile.TemporaryDirectory(prefix=f"quill-bench-{shape}-") as tmp:
            reference, loaded = build(shape, args.smoke, Path(tmp))
        out = results["shapes"][shape] = {
            "config": SMOKE_SHAPES[shape] if args.smoke else SHAPES[shape],
            "parameters": loaded.num_parameters,
            "state_bytes_per_sequence": loaded.model.new_state(1).bytes_per_slot,
        }
        log(f"{shape}: {loaded.num_parameters / 1e6:.1f}M parameters, "
            f"{out['state_bytes_per_sequence']:,} state bytes a sequence")
        part_seconds = out["part_seconds"] = {}
        for part in PARTS:
            if part not in args.parts:
                continue
            start = time.perf_counter()
            log(f"{shape}: {part}")
            if part == "throughput":
                out[part] = throughput(s, reference, loaded, log)
            elif part == "chat":
                out[part] = chat(s, loaded, log)
            else:
                out[part] = decode_step(s, reference, loaded, log)
            part_seconds[part] = time.perf_counter() - start
            out["load_average_after"] = load_average()
    results["load_average_end"] = load_average()
    return results


def summary(results: dict) -> str:
    """The figures as a Markdown table, one block a shape."""
    lines = []
    for shape, out in results["shapes"].items():
        lines.append(f"\n{shape}: {out['parameters'] / 1e6:.1f}M parameters")
        if "throughput" in out:
            t = out["throughput"]
            med, ratios = t["median_tokens_per_s"], t["ratios"]
            lines += ["| contender | output tokens/s (median) | Quill / it |", "| --- | --- | --- |"]
            for name, value in med.items():
                lines.append(f"| {name} | {value:,.1f} | {ratios.get(f'quill_vs_{name}', 1.0):.2f}x |")
            g = t["greedy_check"]
            lines.append(f"greedy tokens equal to transformers' for {g['equal']} of {g['requests']} requests")
        if "chat" in out:
            c = out["chat"]
            on, off = c["medians"]["prefix_caching_on"], c["medians"]["prefix_caching_off"]
            lines.append(f"second turn ({c['conversation']['second_prompt_tokens']} tokens): first token "
                         f"{1e3 * on['first_token_s']:.0f} ms with prefix caching, {1e3 * off['first_token_s']:.0f} ms "
                         f"without ({c['first_token_speedup']:.1f}x); whole answer {on['answer_s']:.2f} s against "
                         f"{off['answer_s']:.2f} s ({c['answer_speedup']:.1f}x)")
        if "step" in out:
            d = out["step"]
            lines.append(f"decode step of {d['rows']} sequences: Quill {d['median_ms']['quill']:.0f} ms, transformers "
                         f"{d['median_ms']['transformers']:.0f} ms ({d['transformers_vs_quill']:.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_models_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeats", type=int, help="throughput repeats (default 2)")
    parser.add_argument("--chat-repeats", type=int, help="chat repeats (default 3)")
    parser.add_argument("--serial-requests", type=int, help="requests run one at a time by transformers (default 4)")
    parser.add_argument("--chat-prompt", type=int, help="the first turn's prompt tokens (default 2000)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and requests: checks that it runs")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = run(args)
    print(summary(results))
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
