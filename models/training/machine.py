"""What ran a training job, so every reported figure says which machine produced it."""

import os
import platform
from pathlib import Path

import torch


def available_cores() -> int:
    """Cores this process may run on (affinity/cgroup-aware where the OS tells us), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine(device: str) -> dict:
    description = {
        "cpu": cpu_model_name(),
        "cores": available_cores(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }
    if torch.device(device).type == "cuda":
        description["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return description
