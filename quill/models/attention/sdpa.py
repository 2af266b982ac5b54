"""Paged attention by gathering: copy each sequence's blocks into padded buffers, then masked SDPA.

Runs wherever PyTorch does, and is the reference the kernel backends are tested against. Its cost
is the gather: every layer copies every sequence's whole context out of the cache, and attends
over the padding up to the longest sequence of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..batch import StepBatch
from .backend import slot_mapping, write_kv


@dataclass
class SdpaPagedAttention:
    """What every layer of one step needs to read and write the paged cache; built once per step."""

    name = "sdpa"

    batch: StepBatch
    slot_mapping: torch.Tensor  # (T,) flat cache slot of each new token
    block_tables: torch.Tensor  # (B, max_blocks)
    mask: torch.Tensor  # (B, 1, max_query_len, max_blocks * block_size): key visible to query
    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    @classmethod
    def build(cls, batch: StepBatch, block_size: int) -> "SdpaPagedAttention":
        tables = batch.block_tables
        # Padded query rows get position 0, so they see key 0 only and never an empty row.
        query_pos = batch.pad(batch.positions)  # (B, Q)
        key_pos = torch.arange(tables.shape[1] * block_size, device=tables.device)
        mask = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
        return cls(batch, slot_mapping(batch, block_size), tables, mask)

    def forward(self, q, k, v, k_cache, v_cache) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, self.slot_mapping)
        keys, values = self.gather(k_cache, v_cache)  # (B, max_blocks * block_size, KVH, hd) each
        out = F.scaled_dot_product_attention(
            self.batch.pad(q).transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=self.mask, enable_gqa=q.shape[1] != k.shape[1],
        )  # (B, H, max_query_len, hd)
        return self.batch.unpad(out.transpose(1, 2).flatten(-2))

    def gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sequence's keys and values, copied out of its blocks into buffers reused by every layer
        (one allocation per step instead of two per layer: fresh large tensors cost page faults)."""
        flat = self.block_tables.flatten()
        if self._buffers is None:
            shape = (flat.numel(), *k_cache.shape[1:])
            self._buffers = (k_cache.new_empty(shape), v_cache.new_empty(shape))
        keys, values = self._buffers
        torch.index_select(k_cache, 0, flat, out=keys)
        torch.index_select(v_cache, 0, flat, out=values)
        batch = self.block_tables.shape[0]
        return keys.view(batch, -1, *k_cache.shape[2:]), values.view(batch, -1, *v_cache.shape[2:])
