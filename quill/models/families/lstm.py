"""Recurrent language model: embedding -> multi-layer LSTM (or GRU, or Elman RNN) -> (optional projection) -> softmax.

State per sequence: h (and for an LSTM c) of every layer, a fixed size whatever the length, so a
decode step costs the same at token 10 and at token 10,000. The GRU and plain-RNN cells and layers of
different sizes are there for the classic checkpoints (PyTorch's word_language_model trains all four
cells; fastai's AWD-LSTM has layers of 1152, 1152 and 400).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..batch import StepBatch
from ..kernels import TORCH_OPS
from ..state import SlotState

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
    # Each layer's hidden size, where they differ (AWD-LSTM: 1152, 1152, 400): the layers are then separate
    # modules (`layers.k`), d_hidden is the top layer's and n_layers their number. None: all d_hidden.
    layer_sizes: list[int] | None = None

    def __post_init__(self):
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, not {self.cell!r}")
        if self.layer_sizes is not None:
            if not self.layer_sizes or min(self.layer_sizes) < 1:
                raise ValueError(f"layer_sizes must be positive sizes, not {self.layer_sizes!r}")
            self.layer_sizes = list(self.layer_sizes)
            self.d_hidden, self.n_layers = self.layer_sizes[-1], len(self.layer_sizes)
        d_out = self.d_proj or self.d_hidden
        if self.tie_embeddings and d_out != self.d_embed:
            raise ValueError(
                f"tied embeddings need the output width ({d_out}) to equal d_embed ({self.d_embed}); set d_proj"
            )


def _recurrent(cell: str, d_in: int, d_hidden: int, n_layers: int, dropout: float) -> nn.Module:
    dropout = dropout if n_layers > 1 else 0.0
    shape = (d_in, d_hidden, n_layers)
    if cell == "lstm":
        return nn.LSTM(*shape, batch_first=True, dropout=dropout)
    if cell == "gru":
        return nn.GRU(*shape, batch_first=True, dropout=dropout)
    return nn.RNN(*shape, nonlinearity=cell.removeprefix("rnn_"), batch_first=True, dropout=dropout)


def run_recurrent(module: nn.Module, x: torch.Tensor, start: tuple[torch.Tensor, ...], lengths: list[int] | None):
    """(B, Q, in) padded inputs from state `start` ((h, c) or (h,), each (L, B, H)) -> (B, Q, H) outputs and
    the end state; `lengths` (each row's real length) when rows differ, None when all are one token."""
    start = start if len(start) == 2 else start[0]
    if lengths is None:
        out, end = module(x, start)
    else:
        packed = pack_padded_sequence(x, torch.tensor(lengths, dtype=torch.long), batch_first=True,
                                      enforce_sorted=False)
        out, end = module(packed, start)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, end if isinstance(end, tuple) else (end,)


class LSTMLanguageModel(nn.Module):
    state_kind = SlotState.kind

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_embed)
        c = config
        if c.layer_sizes is None:  # one module for all layers: cuDNN runs them in one call
            # Named `lstm` whatever the cell: the parameter names of the checkpoints saved before GRU and RNN cells.
            self.lstm, self.layers = _recurrent(c.cell, c.d_embed, c.d_hidden, c.n_layers, c.dropout), None
        else:
            sizes = [c.d_embed] + c.layer_sizes
            self.lstm, self.layers = None, nn.ModuleList(
                _recurrent(c.cell, d_in, d_out, 1, 0.0) for d_in, d_out in zip(sizes, sizes[1:]))
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
        return TORCH_OPS.linear(h, weight, self.lm_bias).float()  # widens a narrowed head (narrow_weights.py)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty state."""
        out = self.drop(self.embed(tokens))
        for module in [self.lstm] if self.layers is None else self.layers:
            out, _ = module(out)
        return self._logits(self.drop(out))

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        """Per slot: (n_layers, d_hidden) for each of h (and c); with layer_sizes, the layers side by side,
        (sum(layer_sizes),)."""
        c = self.config
        like = self.embed.weight
        shape = (num_slots, c.n_layers, c.d_hidden) if c.layer_sizes is None else (num_slots, sum(c.layer_sizes))
        dtype = dtype or like.dtype
        return SlotState({name: torch.zeros(shape, dtype=dtype, device=like.device) for name in self.state_names})

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence from its slot; update the slots in place."""
        x = batch.pad(self.embed(batch.token_ids))  # (B, Q, E)
        lengths = None if batch.max_query_len == 1 else batch.query_lens
        rows = [state[name].index_select(0, batch.slots) for name in self.state_names]  # (B, L, H) or (B, sum of sizes)
        if self.layers is None:
            x, end = run_recurrent(self.lstm, x, tuple(r.transpose(0, 1).contiguous() for r in rows), lengths)  # (L, B, H)
            for name, tensor in zip(self.state_names, end):
                state[name][batch.slots] = tensor.transpose(0, 1)
        else:
            ends, offset = [], 0
            for layer, size in zip(self.layers, self.config.layer_sizes):
                start = tuple(r[:, offset : offset + size].unsqueeze(0).contiguous() for r in rows)  # (1, B, H)
                x, end = run_recurrent(layer, x, start, lengths)
                ends.append(end)
                offset += size
            for i, name in enumerate(self.state_names):
                state[name][batch.slots] = torch.cat([end[i][0] for end in ends], dim=-1)
        out = batch.unpad(x)  # (T, H)
        if batch.logits_indices is not None:
            out = out[batch.logits_indices]
        return self._logits(out)
