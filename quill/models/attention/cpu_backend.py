"""Paged attention on the CPU: decodes through a kernel that reads the cache blocks in place, prompt chunks through
SDPA: a prompt's first chunk over its own new keys and values (causal, nothing gathered), a later chunk over its
blocks gathered as far as its own last position (sdpa.py), never out to the step's widest table.

A decode step's attention is bound by reading each sequence's keys and values. Gathering them into contiguous
buffers first reads them, writes a copy and reads the copy again, padded to the longest context of the group;
the kernel (cpu_kernel.py) reads each key and value once, each sequence only as far as its own position.
Float32 and bfloat16 caches (the kernel computes in float32 either way); other dtypes go the SDPA way.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

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
        parts = [_narrowed(part, block_size) for part in _parts(batch, block_size, group_decodes=False)]
        return cls(batch, slot_mapping(batch, block_size), batch.block_tables, None, parts)

    def _attend(self, part: _Part, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        if part.fresh:
            # (1, heads, tokens, hd): batched 4-D inputs take PyTorch's flash kernel, 3-D ones its matmul path
            q, k, v = (x.transpose(0, 1)[None] for x in (q, k[part.tokens], v[part.tokens]))
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
            return attended[0].transpose(0, 1)
        if part.query_len > 1 or k_cache.dtype not in KERNEL_DTYPES:
            return super()._attend(part, q, k, v, k_cache, v_cache)
        return kernel().paged_decode_attention(q, k_cache, v_cache, part.block_tables, part.lengths,
                                               q.shape[-1] ** -0.5)


def _narrowed(part: _Part, block_size: int) -> _Part:
    """A prompt chunk's part with its table cut to its own last position, and marked fresh where it starts its
    prompt (positions are on the host: one read per chunk and step, shared by every layer)."""
    if part.query_len == 1:
        return part
    first, last = part.query_pos[0, 0].item(), part.query_pos[0, -1].item()
    blocks = last // block_size + 1
    return replace(part, block_tables=part.block_tables[:, :blocks], width=blocks * block_size, fresh=first == 0)
