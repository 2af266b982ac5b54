"""Paged attention read in place by one Triton kernel (`triton_kernel.py`): the default on CUDA.

Per step, `build` cuts each sequence's new tokens into query tiles on the host (the query lengths
are host integers, so no device sync) and uploads them with the sequences' packed offsets in one
copy; a decode step's tiles (one per sequence) are made on the device instead, so it can be
captured in a CUDA graph. Per layer, `forward` writes the new K,V into their cache slots with one indexed copy per
tensor, then launches the kernel once for prefill chunks and decode tokens together.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from itertools import accumulate

import torch

from ..batch import StepBatch
from ..host_copy import to_device
from .backend import slot_mapping, write_kv

# Query tokens per tile when some sequence brings more than one (prefill chunks). Decode-only steps
# use tiles of one token: a tile never mixes sequences, so larger ones would sit mostly empty.
MAX_BLOCK_Q = 16
# Compiled Triton specialises a pointer argument on whether it is 16-byte aligned, compiling the kernel again
# for each combination it meets: the packed offsets therefore start every array on 16 bytes (4 int32s), so
# steps of any shape share one compiled variant per tile size.
ALIGN_INT32S = 4


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _aligned_pack(arrays: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """The int32 arrays copied to `device` in one queued copy, each a view starting on 16 bytes."""
    flat: list[int] = []
    bounds = []
    for values in arrays:
        bounds.append((len(flat), len(flat) + len(values)))
        flat += values
        flat += [0] * (-len(flat) % ALIGN_INT32S)
    packed = to_device(flat, device, torch.int32)
    return [packed[start:end] for start, end in bounds]


@dataclass
class TritonPagedAttention:
    name = "triton"

    slot_mapping: torch.Tensor  # (T,) flat cache slot of each new token
    positions: torch.Tensor  # (T,) position of each new token in its sequence
    block_tables: torch.Tensor  # (B, max_blocks)
    seq_starts: torch.Tensor  # (B + 1,) int32 packed offset of each sequence's first new token, then T
    tile_seqs: torch.Tensor  # (num_tiles,) int32 the sequence of each query tile
    tile_starts: torch.Tensor  # (num_tiles,) int32 its first query, counted within the sequence's new tokens
    block_q: int  # query tokens per tile

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "needs the triton package (pip install triton)"
        if device.type == "cuda":
            return None
        from .triton_kernel import is_interpreted

        if device.type == "cpu" and is_interpreted():
            return None
        return "runs on CUDA devices (on the CPU only in the Triton interpreter: TRITON_INTERPRET=1)"

    @classmethod
    def build(cls, batch: StepBatch, block_size: int) -> "TritonPagedAttention":
        if batch.max_query_len == 1:
            return cls._build_decode(batch, block_size)
        lens = batch.query_lens
        block_q = min(_next_power_of_2(batch.max_query_len), MAX_BLOCK_Q)
        tile_seqs: list[int] = []
        tile_starts: list[int] = []
        for seq, n in enumerate(lens):
            starts = range(0, n, block_q)
            tile_seqs += [seq] * len(starts)
            tile_starts += starts
        # one queued host-to-device copy for all three (a blocking one stalled the host every prefill step)
        seq_starts, tile_seqs, tile_starts = _aligned_pack([[0, *accumulate(lens)], tile_seqs, tile_starts],
                                                           batch.positions.device)
        return cls(
            slot_mapping=slot_mapping(batch, block_size),
            positions=batch.positions,
            block_tables=batch.block_tables,
            seq_starts=seq_starts,
            tile_seqs=tile_seqs,
            tile_starts=tile_starts,
            block_q=block_q,
        )

    @classmethod
    def _build_decode(cls, batch: StepBatch, block_size: int) -> "TritonPagedAttention":
        """One token per sequence: a tile per sequence, made on the device with no copy from the host,
        so a decode step can be captured in a CUDA graph."""
        seq_starts = torch.arange(batch.num_seqs + 1, dtype=torch.int32, device=batch.positions.device)
        return cls(
            slot_mapping=slot_mapping(batch, block_size),
            positions=batch.positions,
            block_tables=batch.block_tables,
            seq_starts=seq_starts,
            tile_seqs=seq_starts[:-1],  # tile i is sequence i's only token
            tile_starts=torch.zeros_like(seq_starts[:-1]),
            block_q=1,
        )

    def forward(self, q, k, v, k_cache, v_cache) -> torch.Tensor:
        from .triton_kernel import paged_attention  # imported late: see that module's note on TRITON_INTERPRET

        write_kv(k, v, k_cache, v_cache, self.slot_mapping)
        out = paged_attention(q, k_cache, v_cache, self.positions, self.block_tables, self.seq_starts,
                              self.tile_seqs, self.tile_starts, self.block_q)  # (T, H, hd)
        return out.flatten(-2)
