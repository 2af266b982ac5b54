"""Rotary position embeddings of q and k in one Triton kernel (rotate-half convention).

One program per token rotates all its query and key heads. The cos/sin tables are the model's
(quill/models/families/transformer.py `rope_tables`), with any long-context rescaling already in their
frequencies, so the kernel knows nothing of it; their two halves are equal, so it reads the first.
It computes in float32 and rounds once, where eager PyTorch rounds each product and the sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(in_ptr, out_ptr, stride_in_t, stride_in_h, stride_out_t, stride_out_h, token, cos, sin,
                  n_heads, HALF: tl.constexpr, HEADS_PAD: tl.constexpr, HALF_PAD: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)[:, None]  # (HEADS_PAD, 1)
    dims = tl.arange(0, HALF_PAD)[None, :]  # (1, HALF_PAD)
    mask = (heads < n_heads) & (dims < HALF)
    first = in_ptr + token * stride_in_t + heads * stride_in_h + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    out = out_ptr + token * stride_out_t + heads * stride_out_h + dims
    dtype = out_ptr.dtype.element_ty
    tl.store(out, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(out + HALF, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rope(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,  # q (T, H, hd), k (T, KVH, hd); head_dim contiguous
    stride_q_out_t, stride_q_out_h, stride_k_out_t, stride_k_out_h,
    stride_cos, stride_sin,  # cos, sin (T, hd)
    n_heads, n_kv_heads,
    HALF: tl.constexpr,  # head_dim // 2
    HALF_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HALF_PAD)
    cos = tl.load(cos_ptr + token * stride_cos + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + token * stride_sin + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, stride_q_out_t, stride_q_out_h, token, cos, sin,
                  n_heads, HALF, HEADS_PAD, HALF_PAD)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, stride_k_out_t, stride_k_out_h, token, cos, sin,
                  n_kv_heads, HALF, KV_HEADS_PAD, HALF_PAD)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q (T, H, hd), k (T, KVH, hd) (any strides but a contiguous head_dim); cos, sin (T, hd) -> rotated q, k."""
    num_tokens, n_heads, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, not {head_dim}")
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype,
                                                                                     device=k.device)
    half = head_dim // 2
    _rope[(num_tokens,)](
        q, k, cos, sin, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos.stride(0), sin.stride(0),
        n_heads, n_kv_heads,
        HALF=half, HALF_PAD=triton.next_power_of_2(half),
        HEADS_PAD=triton.next_power_of_2(n_heads), KV_HEADS_PAD=triton.next_power_of_2(n_kv_heads),
        num_warps=4,
    )
    return q_out, k_out
