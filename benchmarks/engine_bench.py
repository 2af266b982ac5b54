"""Quill's engine against Hugging Face `generate()` and against the CPU's own limits, in one run.

    python -m benchmarks.engine_bench --suite all --out results.json        # ~10-15 min on 2 cores
    python -m benchmarks.engine_bench --quick                               # 1-2 min
    python -m benchmarks.engine_bench --suite decode memory                 # some parts only
    python -m benchmarks.engine_bench --suite throughput --gpt2-vocab 32000 # GPT-2 small, 32k vocabulary

Prints a table and writes every figure (and the machine that produced it) as JSON.
See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .common import report
from .common.hardware import describe_machine, load_average, matmul_flops, read_bandwidth
from .common.parts import PARTS, BenchContext
from .common.settings import FULL, PRESETS, VOCAB_32K, BenchSettings
from .common.timing import write_json


def run(settings: BenchSettings, parts: list[str], log=print) -> dict:
    """Run the chosen parts (in the order of PARTS) and return the results dict."""
    machine = describe_machine() | {"load_average": load_average()}
    log("measuring matmul FLOP/s and read bandwidth ...")
    limits = {
        "matmul_size": settings.matmul_size, "matmul_repeats": settings.matmul_repeats,
        "matmul_flops": matmul_flops(settings.matmul_size, settings.matmul_repeats),
        "bandwidth_bytes": settings.bandwidth_bytes, "bandwidth_repeats": settings.bandwidth_repeats,
        "read_bandwidth": read_bandwidth(settings.bandwidth_bytes, settings.bandwidth_repeats),
    }
    results = {"preset": settings.name, "settings": asdict(settings), "machine": machine, "limits": limits}
    ctx = BenchContext(settings, limits["matmul_flops"], limits["read_bandwidth"])
    try:
        for name, part in PARTS.items():
            if name in parts:
                log(f"running {name} ...")
                start = time.perf_counter()
                results[name] = part(ctx)
                results.setdefault("part_seconds", {})[name] = time.perf_counter() - start
    finally:
        ctx.close()
    machine["load_average_end"] = load_average()
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", nargs="+", default=["all"], choices=["all", *PARTS],
                        help="parts to run (default: all)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="preset", const="quick",
                      help="about a minute: fewer, shorter requests on the same models")
    size.add_argument("--smoke", action="store_const", dest="preset", const="smoke",
                      help="seconds: tiny random models; checks that the code runs, measures nothing")
    parser.add_argument("--gpt2-vocab", type=int, metavar="N",
                        help=f"vocabulary of the random GPT-2 (default 50,257; {VOCAB_32K:,} for the 32k figure)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = PRESETS[args.preset] if args.preset else FULL
    if args.gpt2_vocab:
        settings = replace(settings, gpt2=settings.gpt2 | {"vocab_size": args.gpt2_vocab})
    parts = list(PARTS) if "all" in args.suite else args.suite
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    results = run(settings, parts, log)
    print(report.render(results))
    if args.out:
        write_json(args.out, results)
        log(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
