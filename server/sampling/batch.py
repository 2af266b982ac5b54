"""One step's sampling settings for B sequences, gathered into (B,) tensors on the logits' device.

Built once per engine step from plain Python (the CPU side); the processors then run with no
loop over rows. Tensors a step does not need (no row with penalties, no logit bias, ...) are
None, and the flags say which filters to skip, decided here on the CPU so that skipping costs
no device sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from models.host_copy import to_device

from .params import SamplingParams


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
        from .table import SamplingTable  # the engine's path: settings written to slots, gathered per step

        table = SamplingTable(max(num_rows, 1), vocab_size, device)
        table.write(list(range(num_rows)), list(params))
        slots = torch.arange(num_rows, device=device)
        batch = table.gather(slots, params, generators, prompt_ids, output_ids, eos_token_ids)
        return replace(batch, needs_logprobs=True)  # built on its own, a batch reports every row's log-probability


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
        to_device(rows, device, torch.long),
        to_device(token_ids, device, torch.long),
        to_device(values, device, torch.float32),
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
        to_device(rows, device, torch.long),
        to_device(token_ids, device, torch.long),
    )
