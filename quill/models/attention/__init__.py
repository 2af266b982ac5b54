"""Attention backends for paged K,V caches: a registry, and the choice made when a cache is allocated.

"sdpa" gathers each sequence's blocks and runs PyTorch's SDPA (any device; the reference); "cpu" runs
decodes through a C++ kernel that reads the blocks in place, built on the machine (the CPU default where it
builds, else "sdpa"); "triton" reads the blocks in place with one kernel (the CUDA default). Models never
look at the device: the cache carries the backend chosen for it, and each step builds it once.
"""

from __future__ import annotations

import torch

from ..device_choice import DeviceRegistry
from .backend import PagedAttentionBackend
from .cpu_backend import CpuPagedAttention
from .sdpa import SdpaPagedAttention
from .triton_backend import TritonPagedAttention

__all__ = ["ATTENTION_BACKENDS", "PagedAttentionBackend", "default_attention_backend", "select_attention_backend"]

ATTENTION_BACKENDS: dict[str, type[PagedAttentionBackend]] = {
    "sdpa": SdpaPagedAttention,
    "triton": TritonPagedAttention,
    "cpu": CpuPagedAttention,
}
_REGISTRY = DeviceRegistry("attention backend", ATTENTION_BACKENDS, reference="sdpa",
                           defaults={"cuda": "triton", "cpu": "cpu"})


def default_attention_backend(device: torch.device | str) -> str:
    """The registry's choice for `device`: its default where that can run there, else "sdpa"."""
    return _REGISTRY.default(device)


def select_attention_backend(name: str, device: torch.device | str) -> type[PagedAttentionBackend]:
    """The backend class for `name` ("auto": the device's default); ValueError if it cannot run on `device`."""
    return _REGISTRY.select(name, device)
