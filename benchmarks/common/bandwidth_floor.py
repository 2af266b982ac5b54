"""The memory-bandwidth floor of batch-1 decoding: the weight bytes one step must read / measured read bandwidth.

A decode step of one sequence reads every weight matrix once, so no implementation decodes a token
faster than the device can stream them. An embedding table that is only looked up (one row per token)
is not streamed: the input embedding when the output layer has a matrix of its own, and learned
positions. (Reading the K,V cache adds a little at short contexts; the floor leaves it out.)
"""

from __future__ import annotations

from torch import nn


def _bytes(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters())


def decode_read_bytes(model: nn.Module) -> int:
    """Bytes of weights a batch-1 decode step reads: all of them, less the tables it only looks rows up in."""
    pos_embed = getattr(model, "pos_embed", None)
    looked_up = _bytes(pos_embed)
    if getattr(model, "lm_head", None) is not None:  # untied: the input embedding is not the output layer
        looked_up += sum(_bytes(m) for m in model.modules() if isinstance(m, nn.Embedding) and m is not pos_embed)
    return _bytes(model) - looked_up


def floor_ms_per_token(read_bytes: int, bandwidth: float) -> float:
    """Milliseconds to stream `read_bytes` at `bandwidth` bytes/s."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    return 1000 * read_bytes / bandwidth
