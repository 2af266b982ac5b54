"""Linear layers of a model whose step calls its `nn.Linear` modules, run through layer ops.

The Transformer families hand their weights to their layer ops themselves; the recurrent and state-space families
call their modules. `route_linears` swaps each of those modules for an `OpsLinear` holding the same parameters
(same names, same tensors), whose product runs through the ops: on the CPU, oneDNN over weights packed once
(onednn_ops.py), which outside inference mode falls back to F.linear. The convolutional families multiply by
their kernels as matrices (`MatrixView`).
"""

from __future__ import annotations

import torch
from torch import nn


class OpsLinear(nn.Linear):
    def __init__(self, linear: nn.Linear, ops):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight, self.bias)


def route_linears(model: nn.Module, ops) -> int:
    """Every `nn.Linear` in `model` made an `OpsLinear` over `ops`; how many were."""
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, OpsLinear(child, ops))
                swapped += 1
    return swapped


class MatrixView:
    """A convolution's kernel (out, in, k) as the (out, in * k) matrix its steps multiply by: one view per weight
    tensor, so that layer ops which lay a weight out once, keyed by the tensor (oneDNN's packing), keep it.

    `taps_major`: the columns tap by tap, (out, k * in), the order a step's windows already lie in when each
    position's k inputs are k consecutive rows (B, k, in): the windows go to the product as a view, where the
    kernel's own order needs each window transposed and copied. That matrix is a copy of the weight, made again
    when the weight is replaced or changed in place."""

    def __init__(self, taps_major: bool = False):
        self.taps_major = taps_major
        self._view: tuple[torch.Tensor, int, torch.Tensor] | None = None  # (the weight, its version, its matrix)

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        version = -1 if weight.is_inference() else weight._version  # an inference tensor keeps no version
        if self._view is None or self._view[0] is not weight or self._view[1] != version:
            matrix = weight.detach().transpose(1, 2).flatten(1) if self.taps_major else weight.flatten(1)
            self._view = (weight, version, matrix)
        return self._view[2]
