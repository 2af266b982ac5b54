"""Coverage penalties for beam search over an encoder-decoder (OpenNMT-py's `-coverage_penalty` with `-beta`).

A beam's coverage is, for each source token, its attention summed over every decoder step of the beam so far
(the model's alignment: StepBatch.alignment). A finished hypothesis' score loses beta times:
    wu (Wu et al. 2016, GNMT):  -sum_j log min(coverage_j, 1)   source tokens attended to less than once in all
    summary (OpenNMT's):        sum_j max(coverage_j, 1) - 1      source tokens attended to more than once
Both are 0 for a source covered exactly once. A token never attended to at all (its attention rounded to 0) counts
as float32's smallest coverage, so that the penalty stays finite.
"""

from __future__ import annotations

import torch

TINY = torch.finfo(torch.float32).tiny
NEEDS_ATTENTION = "needs an encoder-decoder model whose decoder attends to its source"


def coverage_penalty(coverage: torch.Tensor, beta: float, kind: str) -> torch.Tensor:
    """(W, S) coverage of W beams over their source's S tokens -> (W,) penalties, never negative."""
    coverage = coverage.float()
    if kind == "wu":
        return -beta * coverage.clamp(min=TINY, max=1.0).log().sum(-1)
    if kind == "summary":
        return beta * (coverage.clamp(min=1.0) - 1.0).sum(-1)
    raise ValueError(f"coverage penalty {kind!r}: 'wu' or 'summary'")
