"""bfloat16 weights on a CPU without bfloat16 arithmetic (AVX2; no AVX-512-BF16 or AMX).

There PyTorch's bfloat16 products run at a tenth of float32's rate and oneDNN packs no bfloat16 weight, so a
bfloat16 model served as such crawls. Asked for bfloat16 on such a CPU, a model keeps its linear layers' weights in
bfloat16 (half the memory of float32, what bfloat16 buys there) and computes in float32: the layer ops widen each
weight into a scratch buffer of this thread's for its product. Activations, caches and the other parameters
(norms, biases, embedding tables, tied output layers) are float32, so the float32 kernels (the paged-attention
kernel, the state families' steps, oneDNN) serve. The arithmetic is float32's over bfloat16-rounded weights.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from .ops_linear import OpsLinear

_scratch = threading.local()  # shape and dtype -> a buffer; one set per thread (tensor-parallel ranks as threads)


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (oneDNN's test: AVX-512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def narrows_weights(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_bf16()


def narrow_linear_weights(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Every routed linear layer's weight (ops_linear.OpsLinear) stored in `dtype`, but those an embedding table
    shares; how many were."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    narrowed = 0
    for module in model.modules():
        if isinstance(module, OpsLinear) and id(module.weight) not in tables and module.weight.dtype != dtype:
            module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
            narrowed += 1
    return narrowed


def widened(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` in `dtype`, written into a buffer reused for every weight of its shape (valid until the next
    call on this thread with that shape)."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    key = (tuple(weight.shape), dtype, weight.device)
    buffer = buffers.get(key)
    if buffer is None:
        buffer = buffers[key] = torch.empty(weight.shape, dtype=dtype, device=weight.device)
    return buffer.copy_(weight)
