"""Paged attention on the CPU: decodes through a kernel that reads the cache blocks in place, prompt chunks through
SDPA over their gathered blocks (sdpa.py).

A decode step's attention is bound by reading each sequence's keys and values. Gathering them into contiguous
buffers first reads them, writes a copy and reads the copy again, padded to the longest context of the group;
the kernel (cpu_kernel.py) reads each key and value once, each sequence only as far as its own position.
Float32 and bfloat16 caches (the kernel computes in float32 either way); other dtypes go the SDPA way.
"""

from __future__ import annotations

import torch

from ..batch import StepBatch
from .backend import slot_mapping
from .cpu_kernel import kernel
from .sdpa import SdpaPagedAttention, _Part, _parts


KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class CpuPagedAttention(SdpaPagedAttention):
    name = "cpu"

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "runs on the CPU only"
        built = kernel()
        return f"needs its C++ kernel, which {built}" if isinstance(built, str) else None

    @classmethod
    def build(cls, batch: StepBatch, block_size: int) -> "CpuPagedAttention":
        return cls(batch, slot_mapping(batch, block_size), batch.block_tables, None,
                   _parts(batch, block_size, group_decodes=False))

    def _attend(self, part: _Part, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        if part.query_len > 1 or k_cache.dtype not in KERNEL_DTYPES:
            return super()._attend(part, q, k_cache, v_cache)
        return kernel().paged_decode_attention(q, k_cache, v_cache, part.block_tables, part.lengths,
                                               q.shape[-1] ** -0.5)
