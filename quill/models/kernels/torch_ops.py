"""The reference layer ops: eager PyTorch, one kernel per elementwise operation.

Every device runs these; they are the CPU default, the path training takes (autograd), and what
the fused kernels are tested against. The Transformer's own modules (the norms, the activations)
do the arithmetic; this class only says how a layer strings them together.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .narrow_weights import widened

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, n_heads, head_dim); cos/sin (..., T, head_dim), rotate-half convention."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


class TorchLayerOps:
    name = "torch"

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    def norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        return norm(x)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): a sublayer's output joins the residual stream, which is normalised."""
        residual = residual + x
        return norm(residual), residual

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q (..., T, H, hd), k (..., T, KVH, hd) rotated by cos/sin (..., T, hd)."""
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if weight.dtype != x.dtype:  # a narrowed weight (narrow_weights.py); autograd keeps its own copy
            weight = weight.to(x.dtype) if torch.is_grad_enabled() else widened(weight, x.dtype)
        return F.linear(x, weight, bias)

    def linear_act(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str) -> torch.Tensor:
        """activation(linear(x)), an MLP's first half."""
        return ACTIVATIONS[activation](self.linear(x, weight, bias))

    def gated_act(self, h: torch.Tensor, activation: str) -> torch.Tensor:
        """h (..., 2F) = [gate; up] -> act(gate) * up (..., F)."""
        gate, up = h.chunk(2, dim=-1)
        return ACTIVATIONS[activation](gate) * up


TORCH_OPS = TorchLayerOps()  # stateless: the default of every model, and the path `forward` always takes
