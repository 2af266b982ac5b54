"""One Triton kernel for paged attention over packed variable-length queries.

A step's queries are packed back to back (a prefill chunk of one sequence, single decode tokens of
others) and every sequence's keys and values live in fixed-size blocks of the paged cache, listed in
its block table. One launch covers them all: a program takes a tile of up to BLOCK_Q consecutive
query tokens of one sequence, for every query head sharing one K,V head (grouped-query attention),
and walks that sequence's blocks in place, TILE_N keys at a time, with an online softmax
(FlashAttention's running maximum and sum), so nothing is gathered or padded in memory.

Interpreted or compiled is decided when this module is imported (`triton.jit` reads
TRITON_INTERPRET then), which is why the backend imports it only when a step first needs it.
Only APIs present in Triton 3.6 and later are used.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot needs every dimension to be at least 16 on NVIDIA GPUs: tiles are padded up to it.
MIN_DOT = 16
LOG2_E = 1.4426950408889634


@triton.jit(do_not_specialize=["stride_table"])  # the widest block table of a step: any width, one variant
def _paged_attention(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    positions_ptr,  # (T,) position of each packed query token in its sequence
    block_tables_ptr,  # (B, max_blocks) cache blocks of each sequence
    seq_starts_ptr,  # (B + 1,) first packed token of each sequence, then T
    tile_seqs_ptr, tile_starts_ptr,  # (num_tiles,) the sequence of each tile, its first query in that sequence
    scale,  # softmax scale times log2(e): scores go through exp2
    stride_qt, stride_qh,  # q (T, H, hd), last dimension contiguous
    stride_ot, stride_oh,  # out (T, H, hd)
    stride_kb, stride_ks, stride_kh,  # k_cache (num_blocks, block_size, KVH, hd)
    stride_vb, stride_vs, stride_vh,  # v_cache (num_blocks, block_size, KVH, hd)
    stride_table,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # HEAD_DIM rounded up to a power of two, at least 16
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (any positive size)
    GROUP: tl.constexpr,  # query heads per K,V head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per tile
    BLOCK_M: tl.constexpr,  # rows of a tile: max(16, BLOCK_Q * GROUP_PAD)
    TILE_N: tl.constexpr,  # keys per inner iteration
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32 rounding), else "tf32" (ignored by 16-bit dots)
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seqs_ptr + tile)
    first_query = tl.load(tile_starts_ptr + tile)
    seq_start = tl.load(seq_starts_ptr + seq)
    query_len = tl.load(seq_starts_ptr + seq + 1) - seq_start

    # Row r of the tile is query token first_query + r // GROUP_PAD, head r % GROUP_PAD of the group.
    rows = tl.arange(0, BLOCK_M)
    query = first_query + rows // GROUP_PAD  # (BLOCK_M,) index within the sequence's new tokens
    head = kv_head * GROUP + rows % GROUP_PAD  # (BLOCK_M,)
    row_ok = (rows // GROUP_PAD < BLOCK_Q) & (query < query_len) & (rows % GROUP_PAD < GROUP)
    token = seq_start + query  # (BLOCK_M,) packed index
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM

    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_M, HEAD_PAD)
    # Causal within the sequence: a query at position p sees keys 0..p. Unused rows get -1: no keys.
    query_pos = tl.load(positions_ptr + token, mask=row_ok, other=-1).to(tl.int32)  # (BLOCK_M,)
    num_keys = tl.max(query_pos, axis=0) + 1  # keys this tile needs: up to its furthest query

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq * stride_table
    for first_key in range(0, num_keys, TILE_N):
        keys = first_key + tl.arange(0, TILE_N)  # (TILE_N,) positions in the sequence
        key_ok = keys < num_keys
        # Each key finds its own block, so a tile may span blocks and block_size need not be 16.
        block = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)  # (TILE_N,)
        slot = keys % BLOCK_SIZE
        kv_mask = key_ok[None, :] & dim_ok[:, None]
        k_t = tl.load(k_cache_ptr + block[None, :] * stride_kb + slot[None, :] * stride_ks + kv_head * stride_kh
                      + dims[:, None], mask=kv_mask, other=0.0)  # (HEAD_PAD, TILE_N): K transposed
        scores = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale  # (BLOCK_M, TILE_N), log2 units
        visible = keys[None, :] <= query_pos[:, None]
        scores = tl.where(visible, scores, float("-inf"))

        new_max = tl.maximum(running_max, tl.max(scores, axis=1))  # (BLOCK_M,)
        # A row that has seen no key yet keeps -inf: subtract 0 instead, so exp2 gives 0, never NaN.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp2(scores - shift[:, None])  # (BLOCK_M, TILE_N)
        rescale = tl.exp2(running_max - shift)  # (BLOCK_M,) what the old sum and acc are worth now
        running_sum = running_sum * rescale + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + block[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                    + dims[None, :], mask=key_ok[:, None] & dim_ok[None, :], other=0.0)  # (TILE_N, HEAD_PAD)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        running_max = new_max

    out = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]  # (BLOCK_M, HEAD_PAD)
    tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                    block_tables: torch.Tensor, seq_starts: torch.Tensor, tile_seqs: torch.Tensor,
                    tile_starts: torch.Tensor, block_q: int, tile_n: int = 32,
                    scale: float | None = None) -> torch.Tensor:
    """q (T, H, hd); k_cache, v_cache (num_blocks, block_size, KVH, hd) -> out (T, H, hd).

    The tiles (`tile_seqs`, `tile_starts`, each query tile's sequence and first query) cut every
    sequence's new tokens into runs of at most `block_q`; `seq_starts` (B + 1,) are the packed offsets.
    `scale`: the softmax's (None: 1 / sqrt(hd)).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the K,V cache's head dimension must be contiguous")
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    grid = (tile_seqs.shape[0], num_kv_heads)
    _paged_attention[grid](
        q, k_cache, v_cache, out, positions, block_tables, seq_starts, tile_seqs, tile_starts,
        LOG2_E * (head_dim**-0.5 if scale is None else scale),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        HEAD_DIM=head_dim,
        HEAD_PAD=max(MIN_DOT, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_M=max(MIN_DOT, block_q * group_pad),
        TILE_N=max(MIN_DOT, tile_n),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out


def is_interpreted() -> bool:
    """Whether this module's kernel runs in the Triton interpreter (TRITON_INTERPRET was set at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_paged_attention, InterpretedFunction)
