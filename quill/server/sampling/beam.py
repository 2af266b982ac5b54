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
                    allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
                    banned: torch.Tensor | None = None,
                    score_shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, V) logits -> (G, K) candidate scores, descending, and their flat indices beam * V + token.

    K is the largest num_candidates; request g uses its first num_candidates columns. `allowed`: beams under a
    grammar, as (rows, masks) over the requests' beams laid end to end, each beam masked by its own grammar.
    A request's K best continuations are among its beams' own K best each: every beam row is ranked on its own
    first (one top-k over its log-probabilities), then each request's beams x K candidates together: no
    (beams, V) table is copied or reordered. Scores are log-probabilities of the unmasked distribution, masks and
    bans applied after, as transformers applies its processors after log-softmax.
    """
    vocab = logits.shape[-1]
    device = logits.device
    rows = [row for r in requests for row in r.rows]
    picked = logits if rows == list(range(logits.shape[0])) else logits.index_select(0, to_device(rows, device))
    picked = torch.log_softmax(picked.float(), dim=-1)  # as transformers ranks beams
    if banned is not None:  # the checkpoint's bad words, in every row (`picked` is log_softmax's own tensor)
        picked.index_fill_(-1, banned, float("-inf"))
    if allowed is not None:
        picked = apply_allowed_tokens(picked, *allowed)
    pairs = [(i, t) for i, r in enumerate(r for r in requests for _ in r.rows) for t in r.banned]
    if pairs:
        index = to_device(pairs, device).T
        picked = picked.index_put_((index[0], index[1]), picked.new_full((), float("-inf")))
    k = min(max(r.num_candidates for r in requests), vocab)
    values, tokens = torch.topk(picked, k=k, dim=-1)  # (R, k)
    scores = to_device([s for r in requests for s in r.scores], device, torch.float32)
    if score_shift is not None:  # (R,): added to each beam's score before ranking (a stepwise coverage penalty)
        scores = scores + score_shift.to(device)
    values = values + scores[:, None]
    width = max(len(r.rows) for r in requests)
    # Row R is all -inf: the padding beams of requests with fewer than `width`.
    values = torch.cat([values, values.new_full((1, k), float("-inf"))])
    flat = torch.cat([tokens, tokens.new_zeros((1, k))])
    order, beam_of, start = [], [], 0
    for r in requests:
        order += list(range(start, start + len(r.rows))) + [len(rows)] * (width - len(r.rows))
        beam_of += list(range(width))
        start += len(r.rows)
    order = to_device(order, device)
    flat = flat.index_select(0, order) + to_device(beam_of, device)[:, None] * vocab  # beam * V + token
    grid = values.index_select(0, order).view(len(requests), width * k)
    best, where = torch.topk(grid, k=min(k, width * k), dim=-1)
    return best, flat.view(len(requests), width * k).gather(1, where)
