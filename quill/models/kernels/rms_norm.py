"""RMSNorm in one Triton kernel, optionally fused with the residual add before it.

`rms_norm(x, weight, eps)` normalises each row; given `residual`, the kernel first adds x into it
and returns the normalised sum with the sum itself (the new residual stream): one read of each input
and one write of each output, where eager PyTorch runs about eight kernels. The rounding follows the
reference (quill/models/families/transformer.py): the sum is rounded to the input dtype before it is normalised,
the normalisation runs in float32, and plain RMSNorm rounds before scaling by the weight while
Gemma's (1 + w) variant scales in float32 and rounds once.

One program per row; the whole row sits in registers (d_model up to 16k or so).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_residual, stride_out, stride_residual_out,  # row strides; columns are contiguous
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,  # scale by (1 + w), Gemma's RMSNorm
    BLOCK: tl.constexpr,  # n_cols rounded up to a power of two
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    normed = x32 * tl.rsqrt(tl.sum(x32 * x32, axis=0) / n_cols + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        out = normed * (1.0 + weight)
    else:
        out = normed.to(x.dtype).to(tl.float32) * weight
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t (..., D) as (rows, D) with contiguous columns (a view when the strides allow)."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x (..., D), weight (D,) -> normalised x; with `residual` (..., D): (norm(x + residual), x + residual)."""
    shape, n_cols = x.shape, x.shape[-1]
    rows = _rows(x)
    out = torch.empty_like(rows)
    if residual is None:
        residual_rows = residual_out = rows  # unread: HAS_RESIDUAL is off
    else:
        residual_rows = _rows(residual)
        residual_out = torch.empty_like(rows)
    block = triton.next_power_of_2(n_cols)
    _rms_norm[(rows.shape[0],)](
        rows, residual_rows, weight, out, residual_out,
        rows.stride(0), residual_rows.stride(0), out.stride(0), residual_out.stride(0),
        n_cols, eps,
        HAS_RESIDUAL=residual is not None, UNIT_OFFSET=unit_offset, BLOCK=block,
        num_warps=min(max(block // 512, 1), 8),
    )
    if residual is None:
        return out.view(shape)
    return out.view(shape), residual_out.view(shape)
