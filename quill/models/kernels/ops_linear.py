"""Linear layers of a model whose step calls its `nn.Linear` modules, run through layer ops.

The Transformer families hand their weights to their layer ops themselves; the recurrent and state-space families
call their modules. `route_linears` swaps each of those modules for an `OpsLinear` holding the same parameters
(same names, same tensors), whose product runs through the ops: on the CPU, oneDNN over weights packed once
(onednn_ops.py), which outside inference mode falls back to F.linear.
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
