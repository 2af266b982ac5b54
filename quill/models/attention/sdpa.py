"""Paged attention by gathering: copy each sequence's blocks into buffers, then masked SDPA.

Runs wherever PyTorch does, and is the reference the kernel backends are tested against. Its cost
is the gather: every layer copies every sequence's whole context out of the cache, and attends
over the padding up to the longest sequence of its part of the step.

A step that mixes one-token decodes with prompt chunks runs in parts: the decodes together, each
chunk on its own. Padded together, every decode row would carry as many query rows as the longest
chunk (a 128-token prompt admitted beside 63 decodes made 64 x 128 query rows for 191 real ones),
and continuous batching admits prompts into most steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch
import torch.nn.functional as F

from ..batch import StepBatch
from ..host_copy import to_device
from .backend import slot_mapping, write_kv


@dataclass
class _Part:
    """Sequences attended together: their packed tokens (a slice where they are contiguous, else an index), their
    block tables, and which keys each query row sees."""

    tokens: slice | torch.Tensor
    num_seqs: int
    query_len: int
    block_tables: torch.Tensor  # (num_seqs, max_blocks)
    mask: torch.Tensor  # (num_seqs, 1, query_len, max_blocks * block_size)
    buffers: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)


def _mask(query_pos: torch.Tensor, width: int) -> torch.Tensor:
    """(B, Q) positions of the query rows -> (B, 1, Q, width): key j visible to a query at position p iff j <= p."""
    key_pos = torch.arange(width, device=query_pos.device)
    return (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)


def _parts(batch: StepBatch, block_size: int) -> list[_Part]:
    """The decodes of a mixed step as one part, then each prompt chunk as a part of its own."""
    lens, tables, positions = batch.query_lens, batch.block_tables, batch.positions
    starts = list(accumulate(lens, initial=0))
    width = tables.shape[1] * block_size
    decodes = [i for i, n in enumerate(lens) if n == 1]
    parts = []
    if decodes:
        first, last = starts[decodes[0]], starts[decodes[-1]]
        if last - first == len(decodes) - 1:  # contiguous (a persistent batch puts its decodes first)
            tokens = slice(first, last + 1)
            seqs = slice(decodes[0], decodes[-1] + 1)
        else:
            tokens = to_device([starts[i] for i in decodes], tables.device, torch.long)
            seqs = to_device(decodes, tables.device, torch.long)
        parts.append(_Part(tokens, len(decodes), 1, tables[seqs], _mask(positions[tokens][:, None], width)))
    for i, n in enumerate(lens):
        if n > 1:
            tokens = slice(starts[i], starts[i + 1])
            parts.append(_Part(tokens, 1, n, tables[i : i + 1], _mask(positions[tokens][None], width)))
    return parts


@dataclass
class SdpaPagedAttention:
    """What every layer of one step needs to read and write the paged cache; built once per step."""

    name = "sdpa"

    batch: StepBatch
    slot_mapping: torch.Tensor  # (T,) flat cache slot of each new token
    block_tables: torch.Tensor  # (B, max_blocks)
    mask: torch.Tensor | None  # (B, 1, max_query_len, max_blocks * block_size): key visible to query
    parts: list[_Part] | None = None  # a mixed step's parts (None: the whole step padded together)
    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    @classmethod
    def build(cls, batch: StepBatch, block_size: int) -> "SdpaPagedAttention":
        tables = batch.block_tables
        slots = slot_mapping(batch, block_size)
        if batch.is_padded:
            return cls(batch, slots, tables, None, _parts(batch, block_size))
        return cls(batch, slots, tables, _mask(batch.pad(batch.positions), tables.shape[1] * block_size))

    def forward(self, q, k, v, k_cache, v_cache) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, self.slot_mapping)
        gqa = q.shape[1] != k.shape[1]
        if self.parts is None:
            keys, values = self.gather(k_cache, v_cache)  # (B, max_blocks * block_size, KVH, hd) each
            out = F.scaled_dot_product_attention(
                self.batch.pad(q).transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                attn_mask=self.mask, enable_gqa=gqa,
            )  # (B, H, max_query_len, hd)
            return self.batch.unpad(out.transpose(1, 2).flatten(-2))
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        for part in self.parts:
            keys, values = self._gather_part(part, k_cache, v_cache)
            queries = q[part.tokens].view(part.num_seqs, part.query_len, *q.shape[1:])
            attended = F.scaled_dot_product_attention(
                queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=part.mask,
                enable_gqa=gqa,
            )  # (seqs, H, query_len, hd)
            out[part.tokens] = attended.transpose(1, 2).reshape(-1, out.shape[1])
        return out

    def gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sequence's keys and values, copied out of its blocks into buffers reused by every layer
        (one allocation per step instead of two per layer: fresh large tensors cost page faults)."""
        if self._buffers is None:
            self._buffers = _buffers_for(self.block_tables, k_cache, v_cache)
        return _gather_into(self._buffers, self.block_tables, k_cache, v_cache)

    def _gather_part(self, part: _Part, k_cache: torch.Tensor, v_cache: torch.Tensor):
        if part.buffers is None:
            part.buffers = _buffers_for(part.block_tables, k_cache, v_cache)
        return _gather_into(part.buffers, part.block_tables, k_cache, v_cache)


def _buffers_for(tables: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
    shape = (tables.numel(), *k_cache.shape[1:])
    return k_cache.new_empty(shape), v_cache.new_empty(shape)


def _gather_into(buffers, tables: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """(B, max_blocks * block_size, KVH, hd) keys and values of the blocks in `tables`, copied into `buffers`."""
    keys, values = buffers
    flat = tables.flatten()
    torch.index_select(k_cache, 0, flat, out=keys)
    torch.index_select(v_cache, 0, flat, out=values)
    rows = tables.shape[0]
    return keys.view(rows, -1, *k_cache.shape[2:]), values.view(rows, -1, *v_cache.shape[2:])
