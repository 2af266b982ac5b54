"""The CPU decode attention kernel alone, at a GPT-2-small decode step: nanoseconds per token row read.

    python -m benchmarks.cpu_attention                          # 35 sequences of 60-190 tokens, 12 heads of 64
    python -m benchmarks.cpu_attention --against old.cpp        # beside another version of the kernel's source
    python -m benchmarks.cpu_attention --threads 1 --dtypes bfloat16

Two settings: "in cache" steps one layer's cache again and again (it stays in the CPU's last-level cache); "out of
cache" steps through 12 layers' caches with 256 MB read between steps, as a model's weights and other layers push
a real step's cache out. Each kernel is timed alternately with the others (median of `--repeats`); a row is one
token's keys and values, all heads. `--against` builds another source (for instance `git show
HEAD~1:quill/models/attention/cpu_paged_decode.cpp > old.cpp`) and checks its outputs against this one's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from quill.models.attention.cpu_kernel import SOURCE
from quill.models.kernels.cpu_build import build

from .common.hardware import describe_machine

SEQS, HEADS, HEAD_DIM, BLOCK, BLOCKS_PER_SEQ = 35, 12, 64, 16, 16


def _kernels(against: list[Path]) -> dict:
    kernels = {}
    for source in [SOURCE, *against]:
        built = build(source, source.name)
        if isinstance(built, str):
            raise SystemExit(f"{source}: {built}")
        kernels["this" if source == SOURCE else str(source)] = built
    return kernels


def measure(kernels: dict, dtype: torch.dtype, layers: int, sweep: torch.Tensor | None, repeats: int,
            seqs: int = SEQS) -> dict[str, float]:
    """Nanoseconds per token row for each kernel, `layers` caches stepped through per timed call."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(60, min(190, BLOCK * BLOCKS_PER_SEQ) + 1, (seqs,), generator=g)
    shape = (seqs * BLOCKS_PER_SEQ, BLOCK, HEADS, HEAD_DIM)
    caches = [tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(2)) for _ in range(layers)]
    q = torch.randn(seqs, HEADS, HEAD_DIM, generator=g).to(dtype)
    times: dict[str, list[float]] = {name: [] for name in kernels}
    outputs = {}
    for _ in range(repeats):
        tables = torch.randperm(seqs * BLOCKS_PER_SEQ, generator=g).view(seqs, BLOCKS_PER_SEQ)
        for name, kernel in kernels.items():
            if sweep is not None:
                sweep.sum()
            start = time.perf_counter()
            for k_cache, v_cache in caches:
                outputs[name] = kernel.paged_decode_attention(q, k_cache, v_cache, tables, lengths, HEAD_DIM ** -0.5)
            times[name].append(time.perf_counter() - start)
    reference = outputs["this"].float()
    for name, out in outputs.items():  # another version must compute the same attention
        torch.testing.assert_close(out.float(), reference, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 2e-2)
    rows = int(lengths.sum()) * layers
    return {name: statistics.median(t) * 1e9 / rows for name, t in times.items()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_attention", description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, nargs="*", default=[], help="other kernel sources to time beside")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="4 sequences, 2 layers, 2 repeats: the code runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels = _kernels(args.against)
    print(f"machine: {describe_machine().get('cpu')}, torch {torch.__version__}, {args.threads} thread(s)")
    seqs, layers, repeats = (4, 2, 2) if args.smoke else (SEQS, 12, args.repeats)
    sweep = torch.empty(1_000_000 if args.smoke else 64_000_000)  # 256 MB
    results = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for setting, n, between in (("in cache", 1, None), ("out of cache", layers, sweep)):
            ns = measure(kernels, dtype, n, between, repeats, seqs)
            results.append({"dtype": dtype_name, "setting": setting, "ns_per_row": ns})
            print(f"{dtype_name:8s} {setting:12s} " + ", ".join(f"{name}: {v:.0f} ns/row" for name, v in ns.items()))
    return results


if __name__ == "__main__":
    main()
