"""The gated MLP's activation in one Triton kernel: [gate; up] -> act(gate) * up (SwiGLU, GeGLU).

The rounding follows the reference (quill/models/kernels/torch_ops.py): the activation runs in float32
and is rounded to the input dtype, then multiplied by `up` and rounded again, as eager PyTorch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # columns per program
# constexpr: a compiled kernel may read no other globals (the interpreter does not check)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
SQRT_1_2 = tl.constexpr(0.7071067811865476)

# Activation name (quill/models/kernels/torch_ops.py ACTIVATIONS) -> the kernel's ACTIVATION code.
KERNEL_ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}


@triton.jit
def _gated_act(
    h_ptr, out_ptr,
    stride_h, stride_out,  # h (T, 2F) = [gate; up], out (T, F); columns contiguous
    n_cols,  # F
    ACTIVATION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate_raw = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0)
    up = tl.load(h_ptr + row * stride_h + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    gate = gate_raw.to(tl.float32)
    if ACTIVATION == 0:
        act = gate * tl.sigmoid(gate)
    elif ACTIVATION == 1:
        act = 0.5 * gate * (1.0 + tl.erf(gate * SQRT_1_2))
    elif ACTIVATION == 2:
        # tanh(z) = 2 sigmoid(2z) - 1
        z = SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * z)
    else:
        act = tl.maximum(gate, 0.0)
    out = act.to(gate_raw.dtype).to(tl.float32) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def gated_act(h: torch.Tensor, activation: str) -> torch.Tensor:
    """h (..., 2F) -> act(gate) * up (..., F), `activation` a key of KERNEL_ACTIVATIONS."""
    width = h.shape[-1]
    if width % 2:
        raise ValueError(f"a gated activation needs [gate; up] of even width, not {width}")
    rows = h.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n_cols = width // 2
    out = torch.empty((rows.shape[0], n_cols), dtype=h.dtype, device=h.device)
    block = min(BLOCK, triton.next_power_of_2(n_cols))
    _gated_act[(rows.shape[0], triton.cdiv(n_cols, block))](
        rows, out, rows.stride(0), out.stride(0), n_cols,
        ACTIVATION=KERNEL_ACTIVATIONS[activation], BLOCK=block, num_warps=4,
    )
    return out.view(*h.shape[:-1], n_cols)
