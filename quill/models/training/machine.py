"""What ran a training job, so every reported figure says which machine produced it."""

import platform
from pathlib import Path

import torch

from quill.models.threads import available_cores


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
