"""Layer ops through fused Triton kernels (rms_norm.py, rope.py, gated_act.py): the CUDA default.

Each op falls back to the reference (torch_ops.py) where no kernel covers the case: a LayerNorm
(GPT-2), a norm whose weight's dtype differs from its input's. The kernels allocate their outputs
from the inputs' shapes and never read a value back to the host, so steps through them can be
captured in CUDA graphs. Inference only: the kernels have no backward.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from .torch_ops import TORCH_OPS


def is_interpreted() -> bool:
    """Whether the kernels run in the Triton interpreter (TRITON_INTERPRET was set when they were imported)."""
    from triton.runtime.interpreter import InterpretedFunction

    from .rms_norm import _rms_norm

    return isinstance(_rms_norm, InterpretedFunction)


class TritonLayerOps:
    name = "triton"

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "needs the triton package (pip install triton)"
        if device.type == "cuda" or (device.type == "cpu" and is_interpreted()):
            return None
        return "runs on CUDA devices (on the CPU only in the Triton interpreter: TRITON_INTERPRET=1)"

    def __init__(self):
        # Imported here, not at the top: triton.jit reads TRITON_INTERPRET when a kernel module is imported.
        from .gated_act import KERNEL_ACTIVATIONS, gated_act
        from .rms_norm import rms_norm
        from .rope import rope

        self._rms_norm, self._rope, self._gated_act = rms_norm, rope, gated_act
        self._activations = KERNEL_ACTIVATIONS

    @staticmethod
    def _fuses(x: torch.Tensor, norm: nn.Module) -> bool:
        """Whether the kernel covers `norm`: an RMSNorm, which says by `unit_offset` whether it scales by (1 + w)
        (quill/models/families/transformer.py), with weights in x's dtype. (A getattr, not a runtime Protocol check: this runs
        several times per layer, and isinstance against a Protocol costs tens of microseconds.)"""
        return getattr(norm, "unit_offset", None) is not None and norm.weight.dtype == x.dtype

    def norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        if not self._fuses(x, norm):
            return TORCH_OPS.norm(x, norm)
        return self._rms_norm(x, norm.weight, norm.eps, norm.unit_offset)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._fuses(x, norm) or residual.dtype != x.dtype:
            return TORCH_OPS.add_norm(x, residual, norm)
        return self._rms_norm(x, norm.weight, norm.eps, norm.unit_offset, residual=residual)

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        if q.dim() != 3:  # the kernel takes packed tokens (T, H, hd), as steps have them
            return TORCH_OPS.rope(q, k, cos, sin)
        return self._rope(q, k, cos, sin)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return TORCH_OPS.linear(x, weight, bias)

    def linear_act(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str) -> torch.Tensor:
        return TORCH_OPS.linear_act(x, weight, bias, activation)

    def gated_act(self, h: torch.Tensor, activation: str) -> torch.Tensor:
        if activation not in self._activations:
            return TORCH_OPS.gated_act(h, activation)
        return self._gated_act(h, activation)
