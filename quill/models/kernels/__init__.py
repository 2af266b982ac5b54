"""Layer ops: how a Transformer layer runs its small operations, chosen once when a model is loaded.

The ops are RMSNorm (alone, and fused with the residual add before it), RoPE on q and k, the gated
MLP's activation and the linear layers. "torch" runs them as eager PyTorch (any device; the reference);
"onednn" is torch's with linear layers over weights packed once for oneDNN (the CPU default); "triton"
fuses each small op into one kernel (the CUDA default). Like the attention backends
(quill/models/attention), the model never looks at the device: it calls the ops object it was given. The other
families' linear modules run through the same ops (ops_linear.py).

The state families' steps have kernels of their own, per device (`fused_state_steps`): Triton on CUDA
(state_steps.py), C++ on the CPU (cpu_state_steps.py).
"""

from __future__ import annotations

import importlib.util
from typing import Protocol

import torch
from torch import nn

from ..device_choice import DeviceRegistry
from . import cpu_state_steps
from .onednn_ops import OneDnnLayerOps
from .torch_ops import TORCH_OPS, TorchLayerOps
from .triton_ops import TritonLayerOps

__all__ = ["LAYER_OPS", "LayerOps", "TORCH_OPS", "default_layer_ops", "fused_state_steps", "select_layer_ops"]

_HAS_TRITON = importlib.util.find_spec("triton") is not None

class LayerOps(Protocol):
    name: str

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """Why these ops cannot run on `device`, or None if they can."""

    def norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor: ...

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x)."""

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor): ...

    def gated_act(self, h: torch.Tensor, activation: str) -> torch.Tensor:
        """[gate; up] -> act(gate) * up."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """F.linear(x, weight, bias)."""

    def linear_act(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str) -> torch.Tensor:
        """ACTIVATIONS[activation](F.linear(x, weight, bias))."""


LAYER_OPS: dict[str, type[LayerOps]] = {"torch": TorchLayerOps, "triton": TritonLayerOps, "onednn": OneDnnLayerOps}
_REGISTRY = DeviceRegistry("layer ops", LAYER_OPS, reference="torch", defaults={"cuda": "triton", "cpu": "onednn"})


def default_layer_ops(device: torch.device | str) -> str:
    """The registry's choice for `device`: its default where that can run there, else "torch"."""
    return _REGISTRY.default(device)


def select_layer_ops(name: str, device: torch.device | str) -> LayerOps:
    """The ops for `name` ("auto": the device's default); ValueError if they cannot run on `device`."""
    return _REGISTRY.select(name, device)()


def fused_state_steps(state: torch.Tensor):
    """The state families' fused steps for a float32 `state`: on CUDA the Triton kernels (state_steps.py), on the
    CPU the C++ ones (cpu_state_steps.py) where they build; else None, and the caller runs its eager step."""
    if state.dtype != torch.float32:
        return None
    if state.device.type == "cpu":
        return cpu_state_steps if not isinstance(cpu_state_steps.steps(), str) else None
    if state.device.type != "cuda" or not _HAS_TRITON:
        return None
    from . import state_steps

    return state_steps
