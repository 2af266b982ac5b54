"""The tensors of a pickled `torch.nn.Module`, read from the inert records `restricted_pickle` rebuilds.

`torch.save(model)` stores each module's `__dict__`: its `_parameters`, `_buffers` and `_modules`
(children, recursively) and whatever attributes its class set. Walking those gives the same names
`model.state_dict()` would, without the module's class.
"""

from __future__ import annotations

import torch

from .restricted_pickle import PickledObject, attributes


def module_tensors(module: PickledObject, prefix: str = "") -> dict[str, torch.Tensor]:
    """name -> tensor, as `state_dict()` names them; a tensor shared by two modules (tied weights) appears
    under both names, as the same object."""
    stored = attributes(module)
    tensors = {}
    for group in ("_parameters", "_buffers"):
        for name, tensor in (stored.get(group) or {}).items():
            if tensor is not None:
                tensors[prefix + name] = tensor
    for name, child in (stored.get("_modules") or {}).items():
        if child is not None:
            tensors.update(module_tensors(child, f"{prefix}{name}."))
    return tensors


def submodule(module: PickledObject, name: str) -> PickledObject | None:
    return (attributes(module).get("_modules") or {}).get(name)
