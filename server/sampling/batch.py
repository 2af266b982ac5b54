"""One step's sampling settings for B sequences, gathered into (B,) tensors on the logits' device.

Built once per engine step from plain Python (the CPU side); the processors then run with no
loop over rows. Tensors a step does not need (no row with penalties, no logit bias, ...) are
None, and the flags say which filters to skip, decided here on the CPU so that skipping costs
no device sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .params import SamplingParams
from .processors import token_counts


def new_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """The generator a seeded request keeps for its whole life, on the device its logits live on."""
    return torch.Generator(device=device).manual_seed(seed)


@dataclass(eq=False)
class SamplingBatch:
    temperature: torch.Tensor  # (B,) float32; 0 on greedy rows
    is_greedy: torch.Tensor  # (B,) bool
    top_k: torch.Tensor  # (B,) int64; 0 = off (greedy rows: off)
    top_p: torch.Tensor  # (B,) float64, see apply_top_p; 1 = off
    min_p: torch.Tensor  # (B,) float32; 0 = off
    repetition_penalty: torch.Tensor  # (B,) float32; 1 = off
    presence_penalty: torch.Tensor  # (B,) float32; 0 = off
    frequency_penalty: torch.Tensor  # (B,) float32; 0 = off
    seen_tokens: torch.Tensor | None  # (B, V) bool: in prompt or output; None when no row has a repetition penalty
    output_counts: torch.Tensor | None  # (B, V) int32; None when no row has a presence/frequency penalty
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (N,) rows, token ids, values of every logit_bias
    banned: tuple[torch.Tensor, torch.Tensor] | None  # (M,) rows, token ids held at -inf until min_tokens
    seeded_rows: list[tuple[int, torch.Generator]]  # random rows that draw their noise from their own generator
    max_top_k: int  # largest active top_k; 0 = no row uses top-k
    uses_top_p: bool
    uses_min_p: bool
    all_greedy: bool
    any_greedy: bool
    num_top_logprobs: int  # largest `logprobs` asked for by any row; 0 = none
    needs_logprobs: bool = True  # False: no row needs its chosen token's log-probability (a softmax saved)

    @property
    def num_rows(self) -> int:
        return int(self.temperature.shape[0])

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        prompt_ids: Sequence[list[int]],
        output_ids: Sequence[list[int]],
        generators: Sequence[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: Sequence[int] = (),
    ) -> "SamplingBatch":
        """Row i samples the next token of a sequence with settings params[i], prompt prompt_ids[i]
        and generated tokens output_ids[i]. generators[i] is used (and advanced) when the row is
        random and it is not None: the engine makes one per seeded request with `new_generator`
        and keeps it across steps. eos_token_ids are banned, with stop_token_ids, until min_tokens.
        """
        num_rows = len(params)
        if not num_rows == len(prompt_ids) == len(output_ids) == len(generators):
            raise ValueError(
                f"one entry per row expected: {num_rows} params, {len(prompt_ids)} prompts, "
                f"{len(output_ids)} outputs, {len(generators)} generators"
            )
        is_greedy = [p.is_greedy for p in params]

        def per_row(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        # Greedy rows turn every filter off: they take the argmax of the penalized logits.
        top_k = [0 if g or p.top_k < 0 else p.top_k for p, g in zip(params, is_greedy)]
        top_p = [1.0 if g else p.top_p for p, g in zip(params, is_greedy)]
        min_p = [0.0 if g else p.min_p for p, g in zip(params, is_greedy)]
        needs_repetition = any(p.repetition_penalty != 1.0 for p in params)
        needs_counts = any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params)
        output_counts = token_counts(list(output_ids), vocab_size, device) if needs_repetition or needs_counts else None
        seen_tokens = None
        if needs_repetition:
            seen_tokens = (token_counts(list(prompt_ids), vocab_size, device) + output_counts) > 0
        return cls(
            temperature=per_row([0.0 if g else p.temperature for p, g in zip(params, is_greedy)], torch.float32),
            is_greedy=per_row(is_greedy, torch.bool),
            top_k=per_row(top_k, torch.long),
            top_p=per_row(top_p, torch.float64),
            min_p=per_row(min_p, torch.float32),
            repetition_penalty=per_row([p.repetition_penalty for p in params], torch.float32),
            presence_penalty=per_row([p.presence_penalty for p in params], torch.float32),
            frequency_penalty=per_row([p.frequency_penalty for p in params], torch.float32),
            seen_tokens=seen_tokens,
            output_counts=output_counts if needs_counts else None,
            bias=flat_logit_bias(params, vocab_size, device),
            banned=flat_banned_tokens(params, output_ids, eos_token_ids, vocab_size, device),
            seeded_rows=[
                (row, gen) for row, (gen, g) in enumerate(zip(generators, is_greedy)) if gen is not None and not g
            ],
            max_top_k=max((k for k in top_k if 0 < k < vocab_size), default=0),
            uses_top_p=any(p < 1.0 for p in top_p),
            uses_min_p=any(p > 0.0 for p in min_p),
            all_greedy=all(is_greedy),
            any_greedy=any(is_greedy),
            num_top_logprobs=max((p.logprobs or 0 for p in params), default=0),
        )


def flat_logit_bias(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    # Ids past the vocabulary are skipped here; SamplingParams.check_vocab rejects them at admission.
    entries = [
        (row, token_id, value)
        for row, p in enumerate(params)
        for token_id, value in (p.logit_bias or {}).items()
        if token_id < vocab_size
    ]
    if not entries:
        return None
    rows, token_ids, values = zip(*entries)
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(token_ids, dtype=torch.long, device=device),
        torch.tensor(values, dtype=torch.float32, device=device),
    )


def flat_banned_tokens(
    params: Sequence[SamplingParams],
    output_ids: Sequence[list[int]],
    eos_token_ids: Sequence[int],
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    # A row may not end (EOS or a stop id) until it has min_tokens generated tokens.
    entries = [
        (row, token_id)
        for row, (p, out) in enumerate(zip(params, output_ids))
        if len(out) < p.min_tokens
        for token_id in p.all_stop_token_ids(eos_token_ids)
        if token_id < vocab_size
    ]
    if not entries:
        return None
    rows, token_ids = zip(*entries)
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(token_ids, dtype=torch.long, device=device),
    )
