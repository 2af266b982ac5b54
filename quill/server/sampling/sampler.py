"""From one row of logits per running sequence to one token per sequence, with log-probabilities.

The order is Hugging Face's and vLLM's, after the grammar's mask (structured outputs): min_tokens bans ->
logit bias -> repetition, presence and frequency penalties -> temperature -> top-k -> top-p -> min-p -> pick. Greedy rows take the
argmax; random rows run an exponential race, which samples from softmax(logits) exactly:
argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. picks i with probability p_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quill.models.host_copy import to_device

from .batch import SamplingBatch
from .processors import (
    apply_allowed_tokens,
    apply_banned_tokens,
    apply_logit_bias,
    apply_min_p,
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
)


@dataclass(eq=False)
class SamplerOutput:
    token_ids: torch.Tensor  # (B,) int64
    logprobs: torch.Tensor | None  # (B,) float32, log p(chosen token) under the raw distribution; None if unneeded
    top_logprobs: torch.Tensor | None  # (B, N) float32, descending; N = batch.num_top_logprobs; None when N = 0
    top_ids: torch.Tensor | None  # (B, N) int64, the tokens of top_logprobs


@dataclass(eq=False)
class PromptLogprobs:
    """Scores of prompt tokens 1..T-1 (token 0 has no prefix to be predicted from)."""

    logprobs: torch.Tensor  # (T-1,) float32: log p(token t | tokens < t) for t = 1..T-1
    top_logprobs: torch.Tensor | None  # (T-1, top_n) float32, descending; None when top_n = 0
    top_ids: torch.Tensor | None  # (T-1, top_n) int64


def process_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """(B, V) raw logits -> (B, V) float32 logits whose softmax is each row's sampling distribution."""
    logits = logits.float()
    if batch.allowed is not None:
        logits = apply_allowed_tokens(logits, *batch.allowed)
    if batch.banned is not None:
        logits = apply_banned_tokens(logits, *batch.banned)
    if batch.bias is not None:
        logits = apply_logit_bias(logits, *batch.bias)
    if batch.seen_tokens is not None:
        logits = apply_repetition_penalty(logits, batch.seen_tokens, batch.repetition_penalty)
    if batch.output_counts is not None:
        logits = apply_presence_frequency_penalties(
            logits, batch.output_counts, batch.presence_penalty, batch.frequency_penalty
        )
    if batch.all_greedy:
        return logits  # the filters below never move an argmax
    logits = apply_temperature(logits, batch.temperature)
    if batch.max_top_k > 0:
        logits = apply_top_k(logits, batch.top_k, batch.max_top_k)
    if batch.uses_top_p:
        logits = apply_top_p(logits, batch.top_p)
    if batch.uses_min_p:
        logits = apply_min_p(logits, batch.min_p)
    return logits


def exponential_race(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """(B, V) probabilities -> (B,) sampled ids: argmax of probs / Exp(1) noise.

    A seeded row draws its V noise values from its own generator, so its tokens do not depend on
    what else is in the batch or where; the other rows share one batched draw.
    """
    noise = torch.empty_like(probs)  # (B, V)
    if len(batch.seeded_rows) < batch.num_rows:
        noise.exponential_()
    for row, generator in batch.seeded_rows:
        noise[row].exponential_(generator=generator)
    # A zero draw would make 0 / 0 = NaN on a masked token, and argmax picks NaN.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return greedy_ids(probs / noise)


CHUNK = 128  # the CPU's greedy pick takes each row's maxima in chunks of this many entries first


def greedy_ids(scores: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,) each row's first highest entry (NaN counting as highest, as `max` does).

    PyTorch's CPU `max` with indices (and `argmax`, slower still) walks a row one entry at a time: 4.5 ms over a
    64 x 32,000 step on one thread of an AMX Xeon, where `amax`, vectorised, takes 0.5. So on the CPU each row's
    chunks of CHUNK entries are reduced by `amax`; the first chunk holding the row's maximum holds its first
    occurrence, and only that chunk is searched with indices."""
    rows, width = scores.shape
    if scores.device.type != "cpu" or width < 2 * CHUNK or not scores.is_contiguous():
        return scores.max(dim=-1).indices
    n = width // CHUNK
    chunks = scores[:, : n * CHUNK].view(rows, n, CHUNK)
    tops = chunks.amax(dim=-1)  # (B, n)
    tail = scores[:, n * CHUNK:]
    if tail.shape[1]:
        tops = torch.cat([tops, tail.amax(dim=-1, keepdim=True)], dim=1)  # the last, shorter chunk
    first = tops.max(dim=-1).indices  # the first chunk holding the row's maximum
    inside = chunks[torch.arange(rows), first.clamp(max=n - 1)].max(dim=-1).indices
    ids = first * CHUNK + inside
    if tail.shape[1]:
        ids = torch.where(first == n, n * CHUNK + tail.max(dim=-1).indices, ids)
    return ids


@torch.inference_mode()
def sample(logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
    """(B, V) logits, one row per sequence -> one token per sequence. `logits` is not modified."""
    processed = process_logits(logits, batch)
    if batch.all_greedy:
        token_ids = greedy_ids(processed)
    else:
        token_ids = exponential_race(processed.softmax(dim=-1), batch)
        if batch.any_greedy:
            token_ids = torch.where(batch.is_greedy, greedy_ids(processed), token_ids)
    if not batch.needs_logprobs:
        return SamplerOutput(token_ids=token_ids, logprobs=None, top_logprobs=None, top_ids=None)
    # Log-probabilities come from the raw model distribution (vLLM's default), not the processed one,
    # so they mean the same thing whatever a request's temperature, penalties or filters.
    raw = logits.float()
    log_normalizer = raw.logsumexp(dim=-1, keepdim=True)  # (B, 1)
    chosen = (raw.gather(1, token_ids.unsqueeze(1)) - log_normalizer).squeeze(1)
    top_logprobs = top_ids = None
    if batch.num_top_logprobs > 0:
        top_values, top_ids = raw.topk(min(batch.num_top_logprobs, raw.shape[-1]), dim=-1)
        top_logprobs = top_values - log_normalizer
    return SamplerOutput(token_ids=token_ids, logprobs=chosen, top_logprobs=top_logprobs, top_ids=top_ids)


@torch.inference_mode()
def prompt_logprobs(logits: torch.Tensor, token_ids: list[int] | torch.Tensor, top_n: int) -> PromptLogprobs:
    """Log-probability of each prompt token given its prefix, for echo and scoring.

    logits: (T, V) or (T-1, V), row t predicting token t+1 (a prefill's logits for every position;
    the last row, which predicts the first generated token, is not used). token_ids: the T prompt tokens.
    """
    if isinstance(token_ids, torch.Tensor):
        targets = token_ids.to(logits.device)[1:]  # (T-1,)
    else:
        targets = to_device(token_ids, logits.device, torch.long)[1:]
    if logits.shape[0] < targets.shape[0]:
        raise ValueError(f"{len(token_ids)} prompt tokens need at least {targets.shape[0]} rows of logits")
    logprobs = torch.log_softmax(logits[: targets.shape[0]].float(), dim=-1)  # (T-1, V)
    chosen = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
    if top_n <= 0:
        return PromptLogprobs(chosen, None, None)
    top_logprobs, top_ids = logprobs.topk(min(top_n, logprobs.shape[-1]), dim=-1)
    return PromptLogprobs(chosen, top_logprobs, top_ids)
