"""A Transformer step's linear layers on the CPU: F.linear against oneDNN over a weight packed once.

    python -m benchmarks.cpu_linear                 # GPT-2-small shapes, 64 and 256 rows, float32 and bfloat16
    python -m benchmarks.cpu_linear --threads 1

Each shape is timed through both paths in the same sitting (the best of `--repeats` calls after warm-up), in
GFLOP/s. bfloat16 is packed only where this CPU's oneDNN has a kernel for it (AVX-512 or AVX-NE-CONVERT);
elsewhere its row says so.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from quill.models.kernels.onednn_ops import OneDnnLayerOps

from .common.hardware import best_seconds, describe_machine

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 32000)]  # qkv, out, up, down, logits


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_linear", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"machine: {describe_machine().get('cpu')}, torch {torch.__version__}, {args.threads} thread(s)")
    rows = []
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            for m in args.rows:
                for k, n in SHAPES:
                    x, w, b = (torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype),
                               torch.randn(n, dtype=dtype))
                    ops = OneDnnLayerOps()
                    ops.linear(x, w, b)
                    flops = 2 * m * k * n
                    plain = flops / best_seconds(lambda: F.linear(x, w, b), args.repeats) / 1e9
                    label = f"{str(dtype).removeprefix('torch.'):8s} {m:4d} rows {k:5d} -> {n:5d}"
                    if not ops.is_packed(w):
                        print(f"{label}: F.linear {plain:6.0f} GFLOP/s; oneDNN cannot pack {dtype} on this CPU")
                        continue
                    packed = flops / best_seconds(lambda: ops.linear(x, w, b), args.repeats) / 1e9
                    rows.append({"dtype": str(dtype), "rows": m, "in": k, "out": n, "f_linear_gflops": plain,
                                 "onednn_gflops": packed})
                    print(f"{label}: F.linear {plain:6.0f} GFLOP/s, oneDNN packed {packed:6.0f} ({packed / plain:.2f}x)")
    return rows


if __name__ == "__main__":
    main()
