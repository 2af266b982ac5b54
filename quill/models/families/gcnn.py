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

from ..batch import StepBatch, run_by_parts, split_decodes
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

    def forward(self, x: torch.Tensor, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C), history (B, k-1, C) of earlier inputs -> (B, T, C), the full input (B, k-1+T, C)."""
        full = torch.cat([history, x], dim=1)
        out = F.glu(self.conv(full.transpose(1, 2)), dim=1)
        return out.transpose(1, 2), full

    def step(self, x: torch.Tensor, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` for serving: each output position's k inputs as one row of a matrix product.

        A decode step has one position per sequence, a shape for which conv1d is 4-5x slower than
        the same arithmetic as a matmul on a CPU (measured at 64 sequences); training keeps conv1d,
        which is faster for long sequences and their backward pass.
        """
        full = torch.cat([history, x], dim=1)  # (B, k-1+T, C)
        batch, steps = x.shape[:2]
        windows = full.unfold(1, self.window + 1, 1).reshape(batch, steps, -1)  # (B, T, C*k), conv weight order
        out = F.linear(windows, self.conv.weight.reshape(self.conv.out_channels, -1), self.conv.bias)
        return F.glu(out, dim=-1), full


class ResidualBlock(nn.Module):
    def __init__(self, config: GCNNConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.convs = nn.ModuleList(GatedConv(config.d_model, config.kernel_size) for _ in range(config.layers_per_block))
        self.drop = nn.Dropout(config.dropout)


class GCNNLanguageModel(nn.Module):
    state_kind = SlotState.kind

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

    def _run(self, x: torch.Tensor, histories: list[torch.Tensor],
             serving: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x (B, T, E) and each convolution's history -> (B, T, C) and each convolution's full input."""
        h = self.drop(x if self.in_proj is None else self.in_proj(x))
        inputs, i = [], 0
        for block in self.blocks:
            y = block.norm(h)
            for conv in block.convs:
                y, full = conv.step(y, histories[i]) if serving else conv(y, histories[i])
                inputs.append(full)
                i += 1
            h = h + block.drop(y)
        return self.norm(h), inputs

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.out_proj is not None:
            h = self.out_proj(h)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty (zero-padded) history."""
        x = self.embed(tokens)
        zeros = x.new_zeros(tokens.shape[0], self.config.kernel_size - 1, self.config.d_model)
        h, _ = self._run(x, [zeros] * self.config.n_convs)
        return self._logits(h)

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        c = self.config
        like = self.embed.weight
        shape = (num_slots, c.n_convs, c.kernel_size - 1, c.d_model)
        return SlotState({"window": torch.zeros(shape, dtype=dtype or like.dtype, device=like.device)})

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence after its window; slide the windows in place. Decode rows run apart
        from prefill chunks (split_decodes), so that they are not padded to a chunk's length."""
        h = run_by_parts(split_decodes(batch), lambda part, tokens: self._part(part, tokens, state), batch.token_ids)
        if batch.logits_indices is not None:
            h = h[batch.logits_indices]
        return self._logits(h)

    def _part(self, part: StepBatch, token_ids: torch.Tensor, state: SlotState) -> torch.Tensor:
        """A part's packed tokens -> their top hidden states (T, C); its slots' windows slid in place."""
        windows = state["window"][part.slots]  # (B, n_convs, k-1, C)
        x = part.pad(self.embed(token_ids))  # (B, Q, E), right-padded: pads never reach real positions
        h, inputs = self._run(x, list(windows.unbind(1)), serving=True)
        k1 = self.config.kernel_size - 1
        if k1 > 0:  # each conv's new window: the k-1 inputs before each sequence's own end
            state["window"][part.slots] = torch.stack([part.last_inputs(full, k1) for full in inputs], dim=1)
        return part.unpad(h)
