"""fairseq's convolutional language model (`fconv_lm`; Dauphin et al. 2017, "Language Modeling with
Gated Convolutional Networks"), the architecture of its published WikiText-103 and Billion Word models.

    embed -> fc1 -> for each (out_channels, kernel_size, residual):
        y = GLU(causal_conv(x))                       # 2*out maps halved by the gate
        x = (y + proj(earlier output)) * sqrt(0.5)    # `residual` layers back; 0: no residual
    -> fc2 -> fc3 (logits), or -> adaptive softmax (log-probabilities)

There are no position embeddings (fairseq builds this decoder with `positional_embeddings=False`),
so a sequence's state is only each convolution's window of its last k-1 inputs: a fixed size,
kept in one flat row per slot (the convolutions' widths differ) and cut into per-layer views.
An empty sequence's state is all zeros, which is exactly the causal zero padding of training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import StepBatch, run_by_parts, split_decodes
from ..kernels import TORCH_OPS, LayerOps
from ..kernels.ops_linear import MatrixView
from ..state import SlotState
from .adaptive_softmax import AdaptiveSoftmax


@dataclass
class FConvConfig:
    vocab_size: int
    embed_dim: int = 128
    # (out_channels, kernel_size, residual): `residual` is how many layers back the added input comes
    # from (1: this layer's own input; 0: none). fairseq's default: [(1268, 4)] * 13.
    layers: list[list[int]] = field(default_factory=lambda: [[1268, 4, 1]] * 13)
    out_embed_dim: int = 128  # fc2's width; unused with an adaptive softmax
    adaptive_softmax_cutoff: list[int] | None = None  # first id of each tail cluster, then vocab_size
    adaptive_softmax_dims: list[int] | None = None  # inner width of each tail cluster
    normalization_constant: float = 0.5  # residual sums are scaled by its square root

    def __post_init__(self):
        self.layers = [list(layer) for layer in self.layers]
        if not self.layers:
            raise ValueError("an fconv model needs at least one convolution")
        for i, layer in enumerate(self.layers):
            if len(layer) != 3 or not all(isinstance(n, int) for n in layer):
                raise ValueError(f"layer {i} must be (out_channels, kernel_size, residual), not {layer}")
            out_channels, kernel_size, residual = layer
            if out_channels < 1 or kernel_size < 1 or not 0 <= residual <= i + 1:
                raise ValueError(f"layer {i} {tuple(layer)}: widths and kernels must be at least 1 and the "
                                 f"residual between 0 and {i + 1}")
        if (self.adaptive_softmax_cutoff is None) != (self.adaptive_softmax_dims is None):
            raise ValueError("adaptive_softmax_cutoff and adaptive_softmax_dims go together")
        if self.adaptive_softmax_cutoff is not None and self.adaptive_softmax_cutoff[-1] != self.vocab_size:
            raise ValueError(f"the last adaptive softmax cutoff must be vocab_size {self.vocab_size}")

    @property
    def in_channels(self) -> list[int]:
        """Each convolution's input width: fc1's output, then the previous convolution's."""
        return [self.layers[0][0]] + [out for out, _, _ in self.layers[:-1]]

    @property
    def window_sizes(self) -> list[int]:
        """Floats of state per slot for each convolution: its last k-1 inputs."""
        return [(k - 1) * c for (_, k, _), c in zip(self.layers, self.in_channels)]


class CausalGatedConv(nn.Module):
    """A convolution over the inputs so far, producing 2*out maps halved by a GLU.

    The weight is kept as nn.Conv1d's (2*out, in, k), applied as one matrix product over each
    position's k inputs (a decode step is one position per sequence, where a matmul beats conv1d).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        # fairseq's initialisation (without dropout), so that a model built from its config alone is defined; a
        # checkpoint's weights replace it (built on the meta device, this costs nothing)
        self.weight = nn.Parameter(torch.randn(2 * out_channels, in_channels, kernel_size)
                                   * (4 / (kernel_size * in_channels)) ** 0.5)
        self.bias = nn.Parameter(torch.zeros(2 * out_channels))
        self.kernel_size = kernel_size
        self.matrix = MatrixView()

    def forward(self, x: torch.Tensor, history: torch.Tensor | None,
                ops: LayerOps = TORCH_OPS) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, in), history (B, k-1, in) -> (B, T, out), and the inputs with history (B, k-1+T, in)."""
        full = x if history is None else torch.cat([history, x], dim=1)
        batch, steps = x.shape[:2]
        windows = full.unfold(1, self.kernel_size, 1).reshape(batch, steps, -1)  # (B, T, in*k), weight order
        return F.glu(ops.linear(windows, self.matrix(self.weight), self.bias), dim=-1), full


class FConvLanguageModel(nn.Module):
    state_kind = SlotState.kind
    layer_ops: LayerOps = TORCH_OPS  # the loader's choice: how a step's convolutions multiply (oneDNN on the CPU)
    # With an adaptive softmax, a row whose argmax alone is read (StepBatch.argmax_only) costs a fraction
    # of its full distribution (adaptive_softmax.py's `greedy`); set per model in __init__.
    cheap_argmax = False

    def __init__(self, config: FConvConfig):
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.embed_dim)
        self.fc1 = nn.Linear(c.embed_dim, c.layers[0][0])
        widths = [c.layers[0][0]]  # output width of fc1, then of each layer: what residuals reach back to
        self.projections = nn.ModuleList()
        self.convolutions = nn.ModuleList()
        for (out_channels, kernel_size, residual), in_channels in zip(c.layers, c.in_channels):
            source = widths[-residual] if residual else out_channels
            self.projections.append(nn.Linear(source, out_channels) if source != out_channels else None)
            self.convolutions.append(CausalGatedConv(in_channels, out_channels, kernel_size))
            widths.append(out_channels)
        last = c.layers[-1][0]
        if c.adaptive_softmax_cutoff is None:
            self.fc2 = nn.Linear(last, c.out_embed_dim)
            self.fc3 = nn.Linear(c.out_embed_dim, c.vocab_size)
            self.adaptive_softmax = None
        else:
            self.fc2 = self.fc3 = None
            self.adaptive_softmax = AdaptiveSoftmax(last, c.adaptive_softmax_cutoff, c.adaptive_softmax_dims)
            self.cheap_argmax = True
        self.residual_scale = math.sqrt(c.normalization_constant)

    def _run(self, tokens: torch.Tensor, histories: list[torch.Tensor | None],
             ops: LayerOps = TORCH_OPS) -> tuple[torch.Tensor, list]:
        """(B, T) tokens and each conv's history -> (B, T, last width) and each conv's input with history."""
        x = self.fc1(self.embed_tokens(tokens))
        outputs, fulls = [x], []
        for (_, _, residual), proj, conv, history in zip(self.config.layers, self.projections,
                                                         self.convolutions, histories):
            x, full = conv(x, history, ops)
            if residual:
                skip = outputs[-residual]
                x = (x + (skip if proj is None else proj(skip))) * self.residual_scale
            outputs.append(x)
            fulls.append(full)
        return x, fulls

    def _scores(self, h: torch.Tensor, argmax_only: torch.Tensor | None = None) -> torch.Tensor:
        """(N, D) -> (N, V) float32: logits, or log-probabilities with an adaptive softmax; rows marked in
        `argmax_only` (N,) bool then hold only their argmax's log-probability, -inf elsewhere."""
        softmax = self.adaptive_softmax
        if softmax is None:
            return self.fc3(self.fc2(h)).float()
        if argmax_only is None:
            return softmax.log_probs(h)
        if bool(argmax_only.all()):  # the common case, a greedy batch: no row needs its distribution
            ids, best = softmax.greedy(h)
            out = h.new_full((h.shape[0], softmax.vocab_size), float("-inf"), dtype=torch.float32)
            return out.scatter_(1, ids[:, None], best[:, None])
        quick, full = argmax_only.nonzero().squeeze(1), (~argmax_only).nonzero().squeeze(1)
        out = h.new_empty((h.shape[0], softmax.vocab_size), dtype=torch.float32)
        out[full] = softmax.log_probs(h[full])
        out.index_fill_(0, quick, float("-inf"))
        ids, best = softmax.greedy(h[quick])
        out[quick, ids] = best
        return out

    def _part(self, part: StepBatch, token_ids: torch.Tensor, state: SlotState) -> torch.Tensor:
        """A part's packed tokens -> their last layer's outputs (T, D); its slots' windows stored in place."""
        histories = self._split_windows(state["windows"][part.slots])
        h, fulls = self._run(part.pad(token_ids), histories, self.layer_ops)  # right-padded: pads follow real ones
        kept = [part.last_inputs(full, k - 1).flatten(1) for full, (_, k, _) in zip(fulls, self.config.layers)
                if k > 1]
        if kept:
            state["windows"][part.slots] = torch.cat(kept, dim=1)
        return part.unpad(h)

    def _zero_histories(self, batch: int, like: torch.Tensor) -> list[torch.Tensor | None]:
        return [like.new_zeros(batch, k - 1, c) if k > 1 else None
                for (_, k, _), c in zip(self.config.layers, self.config.in_channels)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) scores, from an empty (zero-padded) history."""
        h, _ = self._run(tokens, self._zero_histories(tokens.shape[0], self.embed_tokens.weight))
        return self._scores(h.flatten(0, 1)).view(*tokens.shape, -1)

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        like = self.embed_tokens.weight
        width = sum(self.config.window_sizes)
        return SlotState({"windows": torch.zeros(num_slots, width, dtype=dtype or like.dtype, device=like.device)})

    def _split_windows(self, flat: torch.Tensor) -> list[torch.Tensor | None]:
        """(B, sum of window sizes) -> each conv's (B, k-1, in) view, None for k = 1."""
        views = flat.split(self.config.window_sizes, dim=1)
        return [v.view(flat.shape[0], k - 1, c) if k > 1 else None
                for v, (_, k, _), c in zip(views, self.config.layers, self.config.in_channels)]

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """Run the new tokens of each sequence after its windows; store the windows they end with. Decode rows run
        apart from prefill chunks (split_decodes), so that they are not padded to a chunk's length."""
        h = run_by_parts(split_decodes(batch), lambda part, tokens: self._part(part, tokens, state), batch.token_ids)
        if batch.logits_indices is not None:
            h = h[batch.logits_indices]
        return self._scores(h, batch.argmax_only)
