"""One step's sampling settings for B sequences, gathered into (B,) tensors on the logits' device.

Built once per engine step (by `SamplingTable.gather`, table.py); the processors then run with no
loop over rows. Tensors a step does not need (no row with penalties, no logit bias, ...) are
None, and the flags say which filters to skip, decided on the CPU so that skipping costs no
device sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    # Rows under a grammar: (C,) row indices and (C, words) int32 masks of allowed tokens; None: no row has one.
    allowed: tuple[torch.Tensor, torch.Tensor] | None
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
