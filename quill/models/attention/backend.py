"""The contract every paged-attention backend keeps, and the cache-slot arithmetic they share.

A backend is a class built once per step from the step's `StepBatch` (its per-step metadata,
shared by every layer); each layer then calls `forward` with its new tokens' q, k, v and its
slice of the paged cache. `forward` writes k, v into their cache slots and returns attention
over each sequence's cached keys: causal (a query at position p sees keys 0..p of its own
sequence), grouped-query heads, softmax scale 1/sqrt(head_dim).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..batch import StepBatch


class PagedAttentionBackend(Protocol):
    name: str

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """Why this backend cannot run on `device`, or None if it can."""

    @classmethod
    def build(cls, batch: StepBatch, block_size: int) -> "PagedAttentionBackend":
        """The step's metadata (slots, block tables, ...), made once and shared by every layer."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q (T, H, hd), k and v (T, KVH, hd) of the packed new tokens; k_cache and v_cache
        (num_blocks, block_size, KVH, hd) of one layer -> (T, H * hd)."""


def slot_mapping(batch: StepBatch, block_size: int) -> torch.Tensor:
    """(T,) flat cache slot (block * block_size + offset) of each new token."""
    # A decode step copies nothing from the host (seq_of_token), so it can be captured in a CUDA graph.
    pos = batch.positions
    return batch.block_tables[batch.seq_of_token, pos // block_size] * block_size + pos % block_size


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    """One indexed copy per tensor: k, v (T, KVH, hd) into their slots of (num_blocks, block_size, KVH, hd)."""
    k_cache.view(-1, *k.shape[1:])[slots] = k
    v_cache.view(-1, *v.shape[1:])[slots] = v
