"""Which faults an engine survives: a step that fails for its requests' sake, or a device that can run nothing more.

Out of memory, a bad argument or a bug in one step fail that step's requests, and the engine goes on. A sticky
CUDA error (an illegal memory access, a device-side assert, a failed launch) leaves the process's CUDA context
unusable: every later call on it fails again, so a synchronize tells it apart. So does a tensor-parallel group
that lost a rank or fell out of step (parallel/driver.py: its model raises DeviceLostError itself). Such an engine
must stop: its requests fail with the reason, it reports dead (/health and /ready answer 503), and the server, once
no engine is left, exits non-zero so that its supervisor starts a fresh process (serve.py).
"""

from __future__ import annotations

import torch


class EngineStartError(RuntimeError):
    """An engine could not start: its process could not load its model (the message says why) or did not start,
    or a rank of its tensor-parallel group could not load its shard."""


class DeviceLostError(RuntimeError):
    """The device's context is gone, or a rank of the model's tensor-parallel group: nothing more can run."""


def device_lost(device: torch.device) -> bool:
    """Whether `device` fails even a synchronize (after a step raised): a CUDA context killed by a sticky error."""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - whatever the context raises now, it raises for every step after
        return True
    return False
