"""Recurrent language model: embedding -> multi-layer LSTM (or GRU, or Elman RNN) -> (optional projection) -> softmax.

State per sequence: h (and for an LSTM c) of every layer, a fixed size whatever the length, so a
decode step costs the same at token 10 and at token 10,000. The GRU and plain-RNN cells are there for
the classic checkpoints (PyTorch's word_language_model trains all four).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .batch import StepBatch
from .state import SlotState

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@dataclass
class LSTMConfig:
    vocab_size: int
    d_embed: int = 256
    d_hidden: int = 512
    n_layers: int = 2
    d_proj: int | None = None  # linear map from the top hidden state before the softmax
    tie_embeddings: bool = True  # output layer shares the embedding matrix
    dropout: float = 0.0  # training only
    cell: str = "lstm"  # one of CELLS
    output_bias: bool = False  # a bias on the logits (word_language_model's decoder has one)

    def __post_init__(self):
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, not {self.cell!r}")
        d_out = self.d_proj or self.d_hidden
        if self.tie_embeddings and d_out != self.d_embed:
            raise ValueError(
                f"tied embeddings need the output width ({d_out}) to equal d_embed ({self.d_embed}); set d_proj"
            )


def _recurrent_layers(config: LSTMConfig) -> nn.Module:
    dropout = config.dropout if config.n_layers > 1 else 0.0
    shape = (config.d_embed, config.d_hidden, config.n_layers)
    if config.cell == "lstm":
        return nn.LSTM(*shape, batch_first=True, dropout=dropout)
    if config.cell == "gru":
        return nn.GRU(*shape, batch_first=True, dropout=dropout)
    return nn.RNN(*shape, nonlinearity=config.cell.removeprefix("rnn_"), batch_first=True, dropout=dropout)


class LSTMLanguageModel(nn.Module):
    state_kind = SlotState.kind

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_embed)
        # Named `lstm` whatever the cell: the parameter names of the checkpoints saved before GRU and RNN cells.
        self.lstm = _recurrent_layers(config)
        self.proj = nn.Linear(config.d_hidden, config.d_proj) if config.d_proj else None
        self.drop = nn.Dropout(config.dropout)
        d_out = config.d_proj or config.d_hidden
        self.lm_head = None if config.tie_embeddings else nn.Linear(d_out, config.vocab_size, bias=False)
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.output_bias else None

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("h", "c") if self.config.cell == "lstm" else ("h",)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.proj is not None:
            h = self.proj(h)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight, self.lm_bias).float()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty state."""
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        return self._logits(self.drop(out))

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        c = self.config
        like = self.embed.weight
        shape = (num_slots, c.n_layers, c.d_hidden)
        dtype = dtype or like.dtype
        return SlotState({name: torch.zeros(shape, dtype=dtype, device=like.device) for name in self.state_names})

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence from its slot; update the slots in place."""
        x = batch.pad(self.embed(batch.token_ids))  # (B, Q, E)
        # (L, B, H) each; an LSTM's state is the pair (h, c), the other cells' h alone
        start = tuple(state[name][batch.slots].transpose(0, 1).contiguous() for name in self.state_names)
        start = start if len(start) == 2 else start[0]
        if batch.max_query_len == 1:
            out, end = self.lstm(x, start)
        else:
            lengths = torch.tensor(batch.query_lens, dtype=torch.long)
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, end = self.lstm(packed, start)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=batch.max_query_len)
        for name, tensor in zip(self.state_names, end if isinstance(end, tuple) else (end,)):
            state[name][batch.slots] = tensor.transpose(0, 1)
        out = batch.unpad(out)  # (T, H)
        if batch.logits_indices is not None:
            out = out[batch.logits_indices]
        return self._logits(out)
