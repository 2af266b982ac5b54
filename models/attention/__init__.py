"""Attention backends for paged K,V caches: a registry, and the choice made when a cache is allocated.

"sdpa" gathers each sequence's blocks and runs PyTorch's SDPA (any device; the CPU default and the
reference); "triton" reads the blocks in place with one kernel (the CUDA default). Models never
look at the device: the cache carries the backend chosen for it, and each step builds it once.
"""

from __future__ import annotations

import logging

import torch

from .backend import PagedAttentionBackend
from .sdpa import SdpaPagedAttention
from .triton_backend import TritonPagedAttention

__all__ = ["ATTENTION_BACKENDS", "PagedAttentionBackend", "default_attention_backend", "select_attention_backend"]

log = logging.getLogger("quill.models")

ATTENTION_BACKENDS: dict[str, type[PagedAttentionBackend]] = {
    "sdpa": SdpaPagedAttention,
    "triton": TritonPagedAttention,
}
DEFAULTS_BY_DEVICE = {"cuda": "triton"}  # any other device type: "sdpa"


def default_attention_backend(device: torch.device) -> str:
    """The registry's choice for `device`: its default where that can run there, else "sdpa"."""
    name = DEFAULTS_BY_DEVICE.get(torch.device(device).type, "sdpa")
    reason = ATTENTION_BACKENDS[name].unavailable_reason(torch.device(device))
    if reason is not None:
        log.warning("attention backend %r %s; using 'sdpa'", name, reason)
        return "sdpa"
    return name


def select_attention_backend(name: str, device: torch.device | str) -> type[PagedAttentionBackend]:
    """The backend class for `name` ("auto": the device's default); ValueError if it cannot run on `device`."""
    device = torch.device(device)
    if name == "auto":
        name = default_attention_backend(device)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be auto or one of {', '.join(ATTENTION_BACKENDS)}, not {name!r}")
    backend = ATTENTION_BACKENDS[name]
    reason = backend.unavailable_reason(device)
    if reason is not None:
        raise ValueError(f"attention backend {name!r} {reason}")
    return backend
