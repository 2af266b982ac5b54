"""The device half of beam search: the best continuations of every beam request in a step at once.

Each request's live beams are rows of the step's logits. Their log-probabilities plus each
beam's running score are laid out as one (requests, max_beams x V) matrix, rows of requests with
fewer beams padded with -inf, and a single top-k picks every request's candidates. The host half
(`server.engine.beam_search.BeamSearch`) turns candidates into next beams and finished hypotheses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quill.models.host_copy import to_device

from .processors import apply_allowed_tokens


@dataclass(frozen=True, slots=True)
class BeamRequest:
    """One request's beams in the step: their logits rows, in beam order."""

    rows: list[int]
    scores: list[float]  # summed log-probability of each live beam
    num_candidates: int  # how many best continuations the request needs
    banned: tuple[int, ...] = ()  # token ids that may not come next (EOS before min_tokens)


@torch.inference_mode()
def beam_candidates(logits: torch.Tensor, requests: list[BeamRequest],
                    allowed: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, V) logits -> (G, K) candidate scores, descending, and their flat indices beam * V + token.

    K is the largest num_candidates; request g uses its first num_candidates columns. `allowed`: beams under a
    grammar, as (rows, masks) over the requests' beams laid end to end, each beam masked by its own grammar.
    """
    vocab = logits.shape[-1]
    device = logits.device
    rows = [row for r in requests for row in r.rows]
    logprobs = torch.log_softmax(logits.index_select(0, to_device(rows, device)).float(), dim=-1)
    scores = to_device([s for r in requests for s in r.scores], device, torch.float32)
    total = logprobs + scores[:, None]  # (sum of beams, V)
    if allowed is not None:
        total = apply_allowed_tokens(total, *allowed)
    banned = [(i, t) for i, r in enumerate(r for r in requests for _ in r.rows) for t in r.banned]
    if banned:
        index = to_device(banned, device).T
        total = total.index_put((index[0], index[1]), total.new_full((), float("-inf")))
    width = max(len(r.rows) for r in requests)
    # Row `len(rows)` is all -inf: the padding beams of requests with fewer than `width`.
    padded = torch.cat([total, total.new_full((1, vocab), float("-inf"))])
    order, start = [], 0
    for r in requests:
        order += list(range(start, start + len(r.rows))) + [len(rows)] * (width - len(r.rows))
        start += len(r.rows)
    grid = padded.index_select(0, to_device(order, device)).view(len(requests), width * vocab)
    k = min(max(r.num_candidates for r in requests), width * vocab)
    return torch.topk(grid, k=k, dim=-1)
