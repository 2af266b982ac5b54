"""Folding weight normalisation (Salimans & Kingma) into plain weights, as a checkpoint is read.

`torch.nn.utils.weight_norm` stores a layer's weight as a direction `weight_v` and a magnitude
`weight_g`, w = g * v / ||v||, the norm taken over every dimension but one; the newer
parametrization API stores the same pair as `parametrizations.weight.original0` (g) and
`original1` (v). Serving needs only w, computed once here. Which dimension was kept is read from
g's shape (size 1 everywhere else), so checkpoints saved with either convention fold correctly.
"""

from __future__ import annotations

import torch

PAIRS = (("weight_g", "weight_v"), ("parametrizations.weight.original0", "parametrizations.weight.original1"))


def fold_weight(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """g * v / ||v||, the norm over all dimensions where g has size 1."""
    if g.dim() != v.dim() or any(gs not in (1, vs) for gs, vs in zip(g.shape, v.shape)):
        raise ValueError(f"weight-norm magnitude of shape {tuple(g.shape)} does not fit direction {tuple(v.shape)}")
    reduce = [d for d in range(v.dim()) if g.shape[d] == 1]
    v = v.double()  # the fold is done once: in float64, the folded weight is as exact as float32 holds
    norm = v.pow(2).sum(dim=reduce, keepdim=True).sqrt() if reduce else v.abs()
    return (g.double() * v / norm).float()


def fold_weight_norms(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with each (g, v) pair replaced by the plain `weight` it stands for."""
    out = dict(state)
    for key in state:
        for g_name, v_name in PAIRS:
            if key.endswith("." + g_name) or key == g_name:
                prefix = key[: len(key) - len(g_name)]
                v_key = prefix + v_name
                if v_key not in state:
                    raise ValueError(f"{key} has no {v_key} beside it")
                out[prefix + "weight"] = fold_weight(state[key], state[v_key])
                del out[key], out[v_key]
    return out
