"""What the state-space and xLSTM language models share: a fixed-size state slot per sequence, one code path.

A subclass implements `_hidden` (the step's packed tokens -> their top hidden states, each sequence's slot updated
in place) and `_logits`; a full pass over whole sequences is a step from empty slots, so there is no second
implementation to keep equal to the incremental one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from ..batch import StepBatch
from ..state import SlotState


class SlotLanguageModel(nn.Module, ABC):
    state_kind = SlotState.kind

    @abstractmethod
    def _hidden(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """(T, D) the top hidden states of the step's packed tokens; the slots updated in place."""

    @abstractmethod
    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N, V) float32 logits."""

    @abstractmethod
    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        """`num_slots` zeroed slots; `dtype` (default: the weights') for the parts not kept in float32."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty state."""
        num_seqs, length = tokens.shape
        hidden = self._hidden(StepBatch.whole(tokens), self.new_state(num_seqs))
        return self._logits(hidden).view(num_seqs, length, -1)

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence from its slot; update the slots in place."""
        hidden = self._hidden(batch, state)
        if batch.logits_indices is not None:
            hidden = hidden[batch.logits_indices]
        return self._logits(hidden)
