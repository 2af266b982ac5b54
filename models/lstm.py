"""LSTM language model: embedding -> multi-layer LSTM -> (optional projection) -> softmax.

State per sequence: (h, c) of every layer, a fixed size whatever the length, so a
decode step costs the same at token 10 and at token 10,000.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .batch import StepBatch
from .state import SlotState


@dataclass
class LSTMConfig:
    vocab_size: int
    d_embed: int = 256
    d_hidden: int = 512
    n_layers: int = 2
    d_proj: int | None = None  # linear map from the top hidden state before the softmax
    tie_embeddings: bool = True  # output layer shares the embedding matrix
    dropout: float = 0.0  # training only

    def __post_init__(self):
        d_out = self.d_proj or self.d_hidden
        if self.tie_embeddings and d_out != self.d_embed:
            raise ValueError(
                f"tied embeddings need the output width ({d_out}) to equal d_embed ({self.d_embed}); set d_proj"
            )


class LSTMLanguageModel(nn.Module):
    state_kind = SlotState.kind

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_embed)
        self.lstm = nn.LSTM(
            config.d_embed, config.d_hidden, config.n_layers, batch_first=True,
            dropout=config.dropout if config.n_layers > 1 else 0.0,
        )
        self.proj = nn.Linear(config.d_hidden, config.d_proj) if config.d_proj else None
        self.drop = nn.Dropout(config.dropout)
        d_out = config.d_proj or config.d_hidden
        self.lm_head = None if config.tie_embeddings else nn.Linear(d_out, config.vocab_size, bias=False)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.proj is not None:
            h = self.proj(h)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty state."""
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        return self._logits(self.drop(out))

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        c = self.config
        like = self.embed.weight
        shape = (num_slots, c.n_layers, c.d_hidden)
        dtype = dtype or like.dtype
        return SlotState({
            "h": torch.zeros(shape, dtype=dtype, device=like.device),
            "c": torch.zeros(shape, dtype=dtype, device=like.device),
        })

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence from its slot; update the slots in place."""
        x = batch.pad(self.embed(batch.token_ids))  # (B, Q, E)
        h0 = state["h"][batch.slots].transpose(0, 1).contiguous()  # (L, B, H)
        c0 = state["c"][batch.slots].transpose(0, 1).contiguous()
        if batch.max_query_len == 1:
            out, (hn, cn) = self.lstm(x, (h0, c0))
        else:
            lengths = torch.tensor(batch.query_lens, dtype=torch.long)
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, (hn, cn) = self.lstm(packed, (h0, c0))
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=batch.max_query_len)
        state["h"][batch.slots] = hn.transpose(0, 1)
        state["c"][batch.slots] = cn.transpose(0, 1)
        out = batch.unpad(out)  # (T, H)
        if batch.logits_indices is not None:
            out = out[batch.logits_indices]
        return self._logits(out)
