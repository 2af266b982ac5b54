"""What machine ran the benchmark, and the two limits its figures are compared with.

Peak FLOP/s and read bandwidth are measured in the same run as the engine, so a busy or
throttled machine lowers the limits and the measured speeds together. Read bandwidth is
measured on the CPU or on a GPU (its own memory), whichever holds the weights.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from quill.models.threads import available_cores
from quill.models.training.machine import cpu_model_name


def describe_machine() -> dict:
    return {
        "cpu": cpu_model_name(),
        "cores": available_cores(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }


def describe_device(device: torch.device) -> dict:
    """The accelerator the models run on (nothing beyond the type for the CPU, which describe_machine covers)."""
    if device.type != "cuda":
        return {"type": device.type}
    p = torch.cuda.get_device_properties(device)
    return {
        "type": "cuda", "name": p.name, "memory_bytes": p.total_memory, "capability": f"{p.major}.{p.minor}",
        "multiprocessors": p.multi_processor_count, "cuda": torch.version.cuda,
    }


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a GPU's kernels run after the call that launched them returns."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: above the core count, other work shared the CPU with the benchmark."""
    return [round(x, 2) for x in os.getloadavg()]


def best_seconds(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls, after one untimed call that warms caches and kernels."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def matmul_flops(n: int, repeats: int) -> float:
    """FLOP/s of an n x n x n float32 matmul: the compute ceiling model FLOP utilization divides by."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    seconds = best_seconds(lambda: torch.matmul(a, b, out=out), repeats)
    return 2 * n**3 / seconds


@torch.inference_mode()
def read_bandwidth(num_bytes: int, repeats: int, device: str | torch.device = "cpu") -> float:
    """Bytes/s of summing a float32 tensor far larger than the caches, in `device`'s memory: the floor of a
    weight-bound decode step."""
    device = torch.device(device)
    x = torch.ones(num_bytes // 4, device=device)

    def read():
        x.sum()
        synchronize(device)

    seconds = best_seconds(read, repeats)
    return x.numel() * 4 / seconds
