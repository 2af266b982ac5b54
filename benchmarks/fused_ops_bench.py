"""Each fused layer-op kernel (quill/models/kernels) against the eager PyTorch sequence it replaces.

At Llama-3-8B's decode shapes (hidden 4096, 32 query and 8 K,V heads of 128, MLP 14336), for a
batch of 1 and of 256 tokens: RMSNorm, RMSNorm with the residual add, RoPE of q and k, SwiGLU.
Both paths first run once and must agree; then each is timed two ways on CUDA, with CUDA events:
  eager: `iters` calls back to back, as a step without CUDA graphs runs them (host launch cost included);
  graph: the same calls captured in one CUDA graph and replayed, which leaves the GPU's own time.
The per-step line multiplies one layer's ops by the layer count (and adds the final norm): what a
decode step saves. On the CPU (`--smoke`, tiny shapes, the Triton interpreter) it only shows the code runs.

    python -m benchmarks.fused_ops_bench --device cuda                  # bfloat16, batches 1 and 256
    python -m benchmarks.fused_ops_bench --device cuda --out runs/fused_ops.json
    python -m benchmarks.fused_ops_bench --smoke                        # seconds, on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass

import torch

from quill.models.kernels.torch_ops import TORCH_OPS
from quill.models.families.transformer import RMSNorm


@dataclass(frozen=True)
class Shapes:
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    n_layers: int


LLAMA3_8B = Shapes(hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, intermediate=14336, n_layers=32)
SMOKE = Shapes(hidden=48, n_heads=4, n_kv_heads=2, head_dim=12, intermediate=40, n_layers=2)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# How often each op runs in one decode step: per layer a norm, a norm with the residual add, RoPE and
# the activation; the final norm once.
PER_LAYER = ("rms_norm", "add_rms_norm", "rope", "swiglu")


@dataclass
class Timing:
    op: str
    batch: int
    torch_us: float
    fused_us: float
    torch_graph_us: float | None  # CUDA only
    fused_graph_us: float | None
    max_abs_diff: float


def make_cases(shapes: Shapes, batch: int, dtype: torch.dtype, device: torch.device, fused) -> dict:
    """op name -> (reference call, fused call) on fresh random inputs of decode shapes."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    norm = RMSNorm(shapes.hidden, eps=1e-5).to(device, dtype)
    with torch.no_grad():
        norm.weight.copy_(randn(shapes.hidden))
    x, residual = randn(batch, shapes.hidden), randn(batch, shapes.hidden)
    q_width, kv_width = shapes.n_heads * shapes.head_dim, shapes.n_kv_heads * shapes.head_dim
    qkv = randn(batch, q_width + 2 * kv_width)
    q, k, _ = qkv.split([q_width, kv_width, kv_width], -1)  # views, as the model hands them over
    q, k = q.unflatten(-1, (shapes.n_heads, shapes.head_dim)), k.unflatten(-1, (shapes.n_kv_heads, shapes.head_dim))
    angles = torch.rand(batch, shapes.head_dim // 2, generator=g) * 1000
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(device, dtype) for f in (torch.cos, torch.sin))
    gate_up = randn(batch, 2 * shapes.intermediate)
    return {
        "rms_norm": (lambda: TORCH_OPS.norm(x, norm), lambda: fused.norm(x, norm)),
        "add_rms_norm": (lambda: TORCH_OPS.add_norm(x, residual, norm), lambda: fused.add_norm(x, residual, norm)),
        "rope": (lambda: TORCH_OPS.rope(q, k, cos, sin), lambda: fused.rope(q, k, cos, sin)),
        "swiglu": (lambda: TORCH_OPS.gated_act(gate_up, "silu"), lambda: fused.gated_act(gate_up, "silu")),
    }


def max_abs_diff(expected, got) -> float:
    pairs = zip(expected, got) if isinstance(expected, tuple) else [(expected, got)]
    return max((a.float() - b.float()).abs().max().item() for a, b in pairs)


def time_eager_us(fn, iters: int, device: torch.device) -> float:
    """Mean microseconds per call over `iters` calls back to back (after warm-up calls)."""
    for _ in range(3):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return 1e6 * (time.perf_counter() - start) / iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return 1000 * start.elapsed_time(end) / iters


def time_graph_us(fn, iters: int) -> float:
    """Mean microseconds per call of `iters` calls captured in one CUDA graph, replayed (GPU time only)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (and compile) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return 1000 * start.elapsed_time(end) / iters


def run(shapes: Shapes, batches: list[int], dtype: torch.dtype, device: torch.device, iters: int) -> list[Timing]:
    from quill.models.kernels import select_layer_ops

    fused = select_layer_ops("triton", device)
    timings = []
    for batch in batches:
        for op, (reference, kernel) in make_cases(shapes, batch, dtype, device, fused).items():
            diff = max_abs_diff(reference(), kernel())
            if diff > TOLERANCE[dtype] * 10:  # values here are O(1-10): a real disagreement, not rounding
                raise AssertionError(f"{op} at batch {batch}: fused differs from torch by {diff}")
            on_gpu = device.type == "cuda"
            timings.append(Timing(
                op, batch, time_eager_us(reference, iters, device), time_eager_us(kernel, iters, device),
                time_graph_us(reference, iters) if on_gpu else None, time_graph_us(kernel, iters) if on_gpu else None,
                diff,
            ))
    return timings


def per_step_us(timings: list[Timing], batch: int, n_layers: int, field: str) -> float | None:
    """One decode step's time in these ops: n_layers x (each per-layer op) + the final norm."""
    by_op = {t.op: getattr(t, field) for t in timings if t.batch == batch}
    if any(v is None for v in by_op.values()):
        return None
    return n_layers * sum(by_op[op] for op in PER_LAYER) + by_op["rms_norm"]


def describe(device: torch.device) -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "triton_interpret": os.environ.get("TRITON_INTERPRET", "")}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def report(timings: list[Timing], shapes: Shapes, batches: list[int]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:9.1f}"  # noqa: E731
    lines = [f"{'op':<14}{'batch':>6}{'torch us':>10}{'fused us':>10}{'torch graph':>12}{'fused graph':>12}"
             f"{'max diff':>10}"]
    for t in timings:
        lines.append(f"{t.op:<14}{t.batch:>6}{fmt(t.torch_us):>10}{fmt(t.fused_us):>10}"
                     f"{fmt(t.torch_graph_us):>12}{fmt(t.fused_graph_us):>12}{t.max_abs_diff:>10.2e}")
    for batch in batches:
        cols = [per_step_us(timings, batch, shapes.n_layers, f) for f in
                ("torch_us", "fused_us", "torch_graph_us", "fused_graph_us")]
        lines.append(f"{'per step':<14}{batch:>6}" + "".join(f"{fmt(v):>{w}}" for v, w in zip(cols, (10, 10, 12, 12)))
                     + f"   ({shapes.n_layers} layers x {'+'.join(PER_LAYER)}, + final norm)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fused_ops_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default: bfloat16 on CUDA, float32 elsewhere")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 256], help="tokens per decode step")
    parser.add_argument("--iters", type=int, default=200, help="calls per timing")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, few calls: seconds on the CPU")
    parser.add_argument("--out", help="also write the results as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported: no GPU to compile for
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    shapes, batches, iters = (SMOKE, [1, 3], 2) if args.smoke else (LLAMA3_8B, args.batch, args.iters)
    timings = run(shapes, batches, dtype, device, iters)
    result = {"machine": describe(device), "dtype": str(dtype).removeprefix("torch."), "shapes": asdict(shapes),
              "iters": iters, "timings": [asdict(t) for t in timings],
              "per_step_us": {batch: {f: per_step_us(timings, batch, shapes.n_layers, f) for f in
                                      ("torch_us", "fused_us", "torch_graph_us", "fused_graph_us")}
                              for batch in batches}}
    print(json.dumps(result["machine"]))
    print(f"{str(dtype).removeprefix('torch.')}, {shapes}, mean of {iters} calls")
    print(report(timings, shapes, batches))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
