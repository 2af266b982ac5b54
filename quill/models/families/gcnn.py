"""Gated convolutional language model (Dauphin et al. 2017).

Residual blocks of causal 1-D convolutions with gated linear units,
    H = (X * W + b) ⊗ σ(X * V + c),
left-padded with k-1 zeros so no position sees the future. No position
embeddings, as in the paper: the receptive field is the blocks' summed widths.

State per sequence: the last k-1 inputs of every convolution, a fixed size, so a
decode step is one column of each convolution. An empty sequence's state is all
zeros, which is exactly the paper's causal zero padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import StepBatch
from ..kernels import TORCH_OPS, LayerOps
from ..kernels.ops_linear import MatrixView
from ..state import SlotState


@dataclass
class GCNNConfig:
    vocab_size: int
    d_embed: int = 256
    d_model: int = 256  # feature maps of every convolution
    n_blocks: int = 4
    layers_per_block: int = 2
    kernel_size: int = 4
    tie_embeddings: bool = True
    dropout: float = 0.0  # training only

    def __post_init__(self):
        if self.kernel_size < 1 or self.n_blocks < 1 or self.layers_per_block < 1:
            raise ValueError("kernel_size, n_blocks and layers_per_block must be at least 1")

    @property
    def n_convs(self) -> int:
        return self.n_blocks * self.layers_per_block

    @property
    def receptive_field(self) -> int:
        return self.n_convs * (self.kernel_size - 1) + 1


class GatedConv(nn.Module):
    """One causal convolution producing 2*C maps, halved by a GLU."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, 2 * channels, kernel_size)
        self.window = kernel_size - 1
        self.matrix = MatrixView(taps_major=True)  # a window's k inputs are k consecutive rows

    def forward(self, x: torch.Tensor, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C), history (B, k-1, C) of earlier inputs -> (B, T, C), the full input (B, k-1+T, C)."""
        full = torch.cat([history, x], dim=1)
        out = F.glu(self.conv(full.transpose(1, 2)), dim=1)
        return out.transpose(1, 2), full

    def step(self, x: torch.Tensor, history: torch.Tensor, index: tuple[torch.Tensor, torch.Tensor] | None,
             ops: LayerOps = TORCH_OPS) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` for serving, over packed tokens: x (T, C) a step's new inputs, history (B, k-1, C) each
        sequence's window, `index` StepBatch.window_index(k-1) (None: one new token per sequence) -> (T, C), and
        each sequence's next window (B, k-1, C).

        Each position's k inputs are one row of a matrix product: a decode step has one position per sequence,
        a shape for which conv1d is 4-5x slower than the same arithmetic as a matmul on a CPU (measured at 64
        sequences); a prompt's positions are gathered without padding to the longest prompt of the step.
        Training keeps conv1d, which is faster for long sequences and their backward pass.
        """
        if index is None:
            full = torch.cat([history, x[:, None]], dim=1)  # (B, k, C)
            inputs, window = full.flatten(1), full[:, 1:]  # (B, k * C): a view, the taps-major matrix's order
        else:
            rows = torch.cat([history.flatten(0, 1), x])  # (B * (k-1) + T, C)
            inputs, window = rows[index[0]].flatten(1), rows[index[1]]  # (T, k * C)
        return F.glu(ops.linear(inputs, self.matrix(self.conv.weight), self.conv.bias), dim=-1), window


class ResidualBlock(nn.Module):
    def __init__(self, config: GCNNConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.convs = nn.ModuleList(GatedConv(config.d_model, config.kernel_size) for _ in range(config.layers_per_block))
        self.drop = nn.Dropout(config.dropout)


class GCNNLanguageModel(nn.Module):
    state_kind = SlotState.kind
    layer_ops: LayerOps = TORCH_OPS  # the loader's choice: how a step's products run (oneDNN's on the CPU)

    def __init__(self, config: GCNNConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_embed)
        same_width = config.d_embed == config.d_model
        self.in_proj = None if same_width else nn.Linear(config.d_embed, config.d_model)
        self.blocks = nn.ModuleList(ResidualBlock(config) for _ in range(config.n_blocks))
        self.norm = nn.LayerNorm(config.d_model)
        self.out_proj = None if same_width or not config.tie_embeddings else nn.Linear(config.d_model, config.d_embed)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.drop = nn.Dropout(config.dropout)

    def _run(self, x: torch.Tensor, histories: list[torch.Tensor]) -> torch.Tensor:
        """x (B, T, E) from each convolution's history -> (B, T, C) (training and `forward`)."""
        h = self.drop(x if self.in_proj is None else self.in_proj(x))
        convs = iter(histories)
        for block in self.blocks:
            y = block.norm(h)
            for conv in block.convs:
                y, _ = conv(y, next(convs))
            h = h + block.drop(y)
        return self.norm(h)

    def _logits(self, h: torch.Tensor, ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        if self.out_proj is not None:
            h = self.out_proj(h)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return ops.linear(h, weight, None).float()  # widens a narrowed head (narrow_weights.py)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty (zero-padded) history."""
        x = self.embed(tokens)
        zeros = x.new_zeros(tokens.shape[0], self.config.kernel_size - 1, self.config.d_model)
        return self._logits(self._run(x, [zeros] * self.config.n_convs))

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        c = self.config
        like = self.embed.weight
        shape = (num_slots, c.n_convs, c.kernel_size - 1, c.d_model)
        return SlotState({"window": torch.zeros(shape, dtype=dtype or like.dtype, device=like.device)})

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence after its windows, packed (no padding to the longest prompt); slide
        the windows in place."""
        histories = state["window"].index_select(0, batch.slots)  # (B, n_convs, k-1, C); 4x faster than [slots]
        index = None if batch.max_query_len == 1 else batch.window_index(self.config.kernel_size - 1)
        x = self.embed(batch.token_ids)
        h = x if self.in_proj is None else self.in_proj(x)
        slid, i = [], 0
        for block in self.blocks:
            y = block.norm(h)
            for conv in block.convs:
                y, window = conv.step(y, histories[:, i], index, self.layer_ops)
                slid.append(window)
                i += 1
            h = h + y
        if histories.shape[2] > 0:
            state["window"][batch.slots] = torch.stack(slid, dim=1)
        h = self.norm(h)
        if batch.logits_indices is not None:
            h = h[batch.logits_indices]
        return self._logits(h, self.layer_ops)
