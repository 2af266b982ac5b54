"""Exact held-out perplexity of a full-sequence causal language model."""

import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def mean_nll(model: torch.nn.Module, ids: torch.Tensor, context: int, batch_size: int = 16) -> float:
    """Mean negative log-likelihood (nats) of ids[1:], each predicted once.

    The stream is cut into non-overlapping windows of `context` inputs (the last one shorter);
    window k reads ids[kC : (k+1)C] and predicts ids[kC+1 : (k+1)C+1], so every held-out token
    after the first is scored exactly once, and the model never sees more than `context` tokens.
    """
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError("need a 1-D stream of at least two token ids")
    was_training = model.training
    model.eval()
    num_targets = ids.numel() - 1
    num_full_windows = num_targets // context
    total_nll = 0.0
    full = ids[: num_full_windows * context + 1]
    inputs = full[:-1].view(num_full_windows, context)  # (W, C)
    targets = full[1:].view(num_full_windows, context)  # (W, C)
    for start in range(0, num_full_windows, batch_size):
        total_nll += _sum_nll(model, inputs[start : start + batch_size], targets[start : start + batch_size])
    tail_start = num_full_windows * context
    if tail_start < num_targets:
        total_nll += _sum_nll(model, ids[tail_start:-1][None], ids[tail_start + 1 :][None])
    model.train(was_training)
    return total_nll / num_targets


def _sum_nll(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    logits = model(inputs)  # (B, T, V)
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
    return nll.item()


def perplexity(model: torch.nn.Module, ids: torch.Tensor, context: int, batch_size: int = 16) -> float:
    """exp(mean NLL over every predicted held-out token)."""
    return math.exp(mean_nll(model, ids, context, batch_size))
