"""Structured outputs: what constraining every request costs, and the grammar engines side by side.

    python -m benchmarks.structured_bench                 # everything, ~3 min on 2 cores
    python -m benchmarks.structured_bench --part throughput --rounds 5

throughput: 64 concurrent requests through the engine on the CPU (the bundled shakespeare-transformer), every
one constrained by a realistic JSON schema (ORDER_SCHEMA) against the same requests unconstrained, the two
alternated round by round in one run; generated tokens per second, medians, and their ratio.
engines: llguidance (what Quill uses) and xgrammar on one synthetic 32k and one 128k vocabulary: setup,
compile time of the schema, mask time per token along a valid document, and keyword coverage (at 32k).
apply: the sampler's side of a mask at 32k and 128k, per row of a 64-row batch (unpacking the bits, -inf).
Writes the figures and the machine as JSON with --out. See benchmarks/README.md, "Structured outputs".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from quill.models.loading.checkpoint import load_checkpoint
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams, StructuredOutput

from quill.server.sampling.processors import apply_allowed_tokens

from .common.hardware import best_seconds, describe_machine, load_average
from .structured_engines import compare
from .common.structured_vocab import ORDER_SCHEMA, synthetic_vocab

PROMPT = "Write the order as JSON:\n"


def engine_run(core: EngineCore, prompt_ids: list[int], params: list[SamplingParams]) -> tuple[int, float]:
    """All requests added at once, stepped to the end: (generated tokens, seconds)."""
    for i, p in enumerate(params):
        core.add_request(f"r{i}", prompt_ids, p)
    tokens = 0
    start = time.perf_counter()
    while core.has_work():
        for out in core.step():
            tokens += sum(len(c.token_ids) for c in out.outputs)
    return tokens, time.perf_counter() - start


class _TimedFill:
    """Wraps the runner's GrammarMasks.start, adding up the host time it takes (filled in line on the CPU)."""

    def __init__(self, start):
        self._start = start
        self.seconds = 0.0
        self.steps = 0

    def __call__(self, seqs):
        begin = time.perf_counter()
        pending = self._start(seqs)
        if pending is not None:
            self.seconds += time.perf_counter() - begin
            self.steps += 1
        return pending


def apply_cost(vocab_sizes: list[int], rows: int = 64, repeats: int = 20) -> dict:
    """Microseconds per row to apply masks to a (rows, V) batch of logits, every row or half the rows constrained."""
    out = {}
    for vocab in vocab_sizes:
        logits = torch.randn(rows, vocab)
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, (vocab + 31) // 32), dtype=torch.int32)
        every_row = torch.arange(rows)
        seconds = best_seconds(lambda: apply_allowed_tokens(logits, every_row, bitmask), repeats)
        half = torch.arange(0, rows, 2)
        half_seconds = best_seconds(lambda: apply_allowed_tokens(logits, half, bitmask[::2].contiguous()), repeats)
        out[vocab] = {"us_per_row_all_rows": seconds / rows * 1e6, "us_per_row_half_rows": half_seconds / (rows // 2) * 1e6}
    return out


def throughput(num_requests: int, max_tokens: int, rounds: int, log=print) -> dict:
    loaded = load_checkpoint("shakespeare-transformer", device="cpu", dtype="float32")
    config = EngineConfig(SchedulerConfig(max_num_seqs=num_requests, max_num_batched_tokens=2048),
                          CacheConfig(cache_bytes=256 * 2**20))
    core = EngineCore(loaded, config)
    prompt_ids = loaded.tokenizer.encode(PROMPT)
    structured = StructuredOutput.json_schema(ORDER_SCHEMA)
    start = time.perf_counter()
    core.grammars.compile(structured)
    compile_s = time.perf_counter() - start
    kinds = {
        "unconstrained": [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True)
                          for i in range(num_requests)],
        "constrained": [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, structured=structured)
                        for i in range(num_requests)],
    }
    engine_run(core, prompt_ids, kinds["unconstrained"][:4])  # warm-up: first steps, allocator, threads
    fill = core.runner.grammar_masks.start = _TimedFill(core.runner.grammar_masks.start)
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        for kind, params in kinds.items():
            tokens, seconds = engine_run(core, prompt_ids, params)
            rates[kind].append(tokens / seconds)
            log(f"  round {r + 1} {kind}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.0f} tok/s")
    medians = {kind: statistics.median(v) for kind, v in rates.items()}
    # Each round's two runs are back to back: their ratio shares the load of that moment, on a shared machine.
    pair_ratios = [c / u for c, u in zip(rates["constrained"], rates["unconstrained"])]
    return {"model": "shakespeare-transformer", "num_requests": num_requests, "max_tokens": max_tokens,
            "rounds": rounds, "tokens_per_s": rates, "median_tokens_per_s": medians,
            "constrained_over_unconstrained": medians["constrained"] / medians["unconstrained"],
            "round_ratios": pair_ratios, "median_round_ratio": statistics.median(pair_ratios),
            "schema_compile_s": compile_s, "torch_threads": torch.get_num_threads(),
            "mask_fill_ms_per_step": fill.seconds / max(fill.steps, 1) * 1e3,
            "mask_fill_us_per_row": fill.seconds / max(fill.steps, 1) / num_requests * 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.structured_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--part", nargs="+", default=["throughput", "apply", "engines"],
                        choices=["throughput", "apply", "engines"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[32_000, 128_000],
                        help="vocabularies of the engines and apply parts (coverage runs at the first)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    results = {"machine": describe_machine() | {"load_average": load_average()}}
    if "throughput" in args.part:
        print(f"throughput: {args.requests} requests, {args.max_tokens} tokens at most, {args.rounds} rounds")
        results["throughput"] = t = throughput(args.requests, args.max_tokens, args.rounds)
        print(f"median tok/s: constrained {t['median_tokens_per_s']['constrained']:.0f}, unconstrained "
              f"{t['median_tokens_per_s']['unconstrained']:.0f}, ratio {t['constrained_over_unconstrained']:.2f} "
              f"(median of the rounds' ratios {t['median_round_ratio']:.2f}); "
              f"schema compiled in {t['schema_compile_s'] * 1e3:.1f} ms; masks filled in "
              f"{t['mask_fill_ms_per_step']:.2f} ms a step ({t['mask_fill_us_per_row']:.1f} us a row)")
    if "apply" in args.part:
        results["apply"] = a = apply_cost(args.vocab_sizes)
        for vocab, f in a.items():
            print(f"apply at {vocab // 1000}k: {f['us_per_row_all_rows']:.1f} us a row (every row constrained), "
                  f"{f['us_per_row_half_rows']:.1f} us a row (half the rows)")
    if "engines" in args.part:
        results["engines"] = {}
        for size in args.vocab_sizes:
            print(f"engines at a {size // 1000}k vocabulary ...")
            results["engines"][size] = figures = compare(synthetic_vocab(size), coverage=size == args.vocab_sizes[0])
            for name, f in figures.items():
                print(f"  {name}: setup {f['setup_s'] * 1e3:.0f} ms, compile {f['compile_s_median'] * 1e3:.1f} ms, "
                      f"mask per token median {f['mask_us_median']:.1f} us, p90 {f['mask_us_p90']:.0f} us, "
                      f"max {f['mask_us_max']:.0f} us")
            for name, f in figures.items():
                for schema, outcome in f.get("coverage", {}).items():
                    print(f"    {name:10s} {schema:52s} {outcome}")
    results["machine"]["load_average_end"] = load_average()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
