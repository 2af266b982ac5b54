"""Paged attention by gathering: copy each sequence's blocks into buffers, then masked SDPA.

Runs wherever PyTorch does, and is the reference the kernel backends are tested against. Its cost
is the gather: every layer copies every sequence's whole context out of the cache, and attends
over the padding up to the longest sequence of its part of the step.

A step that mixes one-token decodes with prompt chunks runs in parts: the decodes together, each
chunk on its own. Padded together, every decode row would carry as many query rows as the longest
chunk (a 128-token prompt admitted beside 63 decodes made 64 x 128 query rows for 191 real ones),
and continuous batching admits prompts into most steps. On the CPU the decodes are also grouped by
context length, so that a short context is not gathered and attended out to the longest one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
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
    query_pos: torch.Tensor  # (num_seqs, query_len) each query row's position
    width: int  # keys gathered per sequence: max_blocks * block_size
    fresh: bool = False  # a prompt's first chunk: its keys are its own new tokens (set by backends that use it)
    buffers: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @cached_property
    def mask(self) -> torch.Tensor:
        """(num_seqs, 1, query_len, width): which keys each query row sees (made once, for SDPA only)."""
        return _mask(self.query_pos, self.width)

    @property
    def lengths(self) -> torch.Tensor:
        """(num_seqs,) a decode part's keys per sequence: its position + 1."""
        return self.query_pos[:, 0] + 1


MAX_DECODE_GROUPS, MIN_DECODE_GROUP = 4, 16  # a group's ops cost about what padding 16 rows does


def _mask(query_pos: torch.Tensor, width: int) -> torch.Tensor:
    """(B, Q) positions of the query rows -> (B, 1, Q, width): key j visible to a query at position p iff j <= p."""
    key_pos = torch.arange(width, device=query_pos.device)
    return (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)


def _decode_groups(decodes: list[int], starts: list[int], positions: torch.Tensor) -> list[list[int]]:
    """The decoding sequences in groups of similar context length, each padded only to its own longest: on the
    CPU, where positions can be read without waiting for a device, and where that pads at least a fifth less."""
    if positions.device.type != "cpu" or len(decodes) < 2 * MIN_DECODE_GROUP:
        return [decodes]
    lengths = positions[[starts[i] for i in decodes]].tolist()
    order = sorted(range(len(decodes)), key=lengths.__getitem__)
    size = -(-len(order) // min(MAX_DECODE_GROUPS, len(order) // MIN_DECODE_GROUP))
    groups = [order[g : g + size] for g in range(0, len(order), size)]
    padded = sum(len(group) * lengths[group[-1]] for group in groups)
    if padded > 0.8 * len(order) * lengths[order[-1]]:
        return [decodes]
    return [sorted(decodes[j] for j in group) for group in groups]


def _decode_part(seqs: list[int], starts: list[int], batch: StepBatch, block_size: int, narrow: bool) -> _Part:
    """Decodes attended together. `narrow`: their tables cut to their longest context (a host read of their
    positions: on the CPU only, and never where a step is captured as a graph)."""
    tables, positions, device = batch.block_tables, batch.positions, batch.block_tables.device
    first, last = starts[seqs[0]], starts[seqs[-1]]
    if last - first == len(seqs) - 1 and seqs[-1] - seqs[0] == len(seqs) - 1:  # contiguous: a persistent batch's
        tokens, rows = slice(first, last + 1), slice(seqs[0], seqs[-1] + 1)
    else:
        tokens, rows = to_device([starts[i] for i in seqs], device, torch.long), to_device(seqs, device, torch.long)
    query_pos = positions[tokens][:, None]
    blocks = tables.shape[1]
    if narrow and device.type == "cpu":  # no wider than the group's longest context
        blocks = int(query_pos.max()) // block_size + 1
    return _Part(tokens, len(seqs), 1, tables[rows, :blocks], query_pos, blocks * block_size)


def _parts(batch: StepBatch, block_size: int, group_decodes: bool = True) -> list[_Part] | None:
    """The step's decodes (in groups of similar context where `group_decodes`), then each prompt chunk on its
    own; None where that is the whole step padded together (decodes alone in one group, or chunks of one length
    alone) and `group_decodes`."""
    lens = batch.query_lens
    starts = list(accumulate(lens, initial=0))
    decodes = [i for i, n in enumerate(lens) if n == 1]
    if not decodes:
        groups = []
    else:
        groups = _decode_groups(decodes, starts, batch.positions) if group_decodes else [decodes]
    if group_decodes and not batch.is_padded and len(groups) <= 1:
        return None
    parts = [_decode_part(group, starts, batch, block_size, narrow=group_decodes) for group in groups]
    width = batch.block_tables.shape[1] * block_size
    for i, n in enumerate(lens):
        if n > 1:
            tokens = slice(starts[i], starts[i + 1])
            parts.append(_Part(tokens, 1, n, batch.block_tables[i : i + 1], batch.positions[tokens][None], width))
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
        parts = _parts(batch, block_size)
        if parts is not None:
            return cls(batch, slots, tables, None, parts)
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
            out[part.tokens] = self._attend(part, q[part.tokens], k, v, k_cache, v_cache).reshape(-1, out.shape[1])
        return out

    def _attend(self, part: _Part, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        """One part's attention: its queries q (tokens, H, hd) -> (tokens, H, hd). k, v: the whole step's new keys
        and values (T, KVH, hd), the part's at `part.tokens`; already in the cache, where this reads them."""
        keys, values = self._gather_part(part, k_cache, v_cache)
        queries = q.view(part.num_seqs, part.query_len, *q.shape[1:])
        attended = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=part.mask,
            enable_gqa=q.shape[1] != k_cache.shape[2],
        )  # (seqs, H, query_len, hd)
        return attended.transpose(1, 2).reshape(q.shape)

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
