"""xLSTM language model (NX-AI's xLSTM-7b; transformers' `xLSTMForCausalLM`): a stack of mLSTM blocks.

A block is pre-norm residual twice: RMSNorm -> mLSTM layer (q, k, v, output gate and per-head input and forget gates
from one input; the gates soft-capped by tanh; the cell of `models.mlstm`; a layer norm per head; the output gate;
a projection back) and RMSNorm -> SwiGLU feed-forward. A final RMSNorm, the LM head and a tanh soft cap on the
logits. Parameter names are the checkpoint's (`backbone.blocks.0.mlstm_layer.q.weight`), so it loads as saved.

State per sequence and block: the mLSTM memory C (heads, d_qk, d_v), normaliser n (heads, d_qk) and stabiliser m
(heads), all float32 (see `models.mlstm`), a fixed size whatever the length. For xLSTM-7b (4096 wide, 32 blocks,
8 heads, qk_dim_factor 0.5: d_qk 256, d_v 512) that is 32 x 8 x (256 x 512 + 256 + 1) x 4 bytes = 134,480,896
bytes (128.25 MiB) per sequence, of which C is 99.8%: the size of a Llama-2-7B K,V cache at about 256 tokens.

Decode is one recurrent step; a prefill chunk (from any saved state) runs the chunkwise-parallel form
`config.chunk_size` tokens at a time, exact up to float32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels

from ..batch import StepBatch, run_by_parts, split_decodes
from ..state import SlotState
from . import mlstm
from .slot_model import SlotLanguageModel
from .transformer import rms_normalise

WEIGHT_MODES = ("single", "fused")  # q, k, v, gates as separate matrices or concatenated ones
STATE_NAMES = ("C", "n", "m")


@dataclass
class XLSTMConfig:
    vocab_size: int
    d_model: int = 4096
    n_blocks: int = 32
    n_heads: int = 8
    qk_dim_factor: float = 0.5  # query/key width as a fraction of d_model
    v_dim_factor: float = 1.0  # value width as a fraction of d_model
    ffn_proj_factor: float = 2.667  # feed-forward width, rounded up to a multiple of ffn_round_up_to_multiple_of
    ffn_round_up_to_multiple_of: int = 64
    use_bias: bool = False  # biases on every projection and norm (the gates always have one)
    weight_mode: str = "single"  # one of WEIGHT_MODES
    norm_eps: float = 1e-6
    eps: float = 1e-6  # added to the mLSTM's denominator
    gate_soft_cap: float | None = 15.0  # input and forget gate pre-activations: cap * tanh(x / cap); None: off
    output_logit_soft_cap: float | None = 30.0
    chunk_size: int = 64  # tokens per piece of the chunkwise-parallel prefill
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.weight_mode not in WEIGHT_MODES:
            raise ValueError(f"weight_mode must be one of {', '.join(WEIGHT_MODES)}, not {self.weight_mode!r}")
        if self.qk_dim % self.n_heads or self.v_dim % self.n_heads or min(self.qk_dim, self.v_dim) < 1:
            raise ValueError(f"q/k width {self.qk_dim} and value width {self.v_dim} must be positive multiples "
                             f"of num_heads {self.n_heads}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, not {self.chunk_size}")

    @property
    def qk_dim(self) -> int:
        return int(self.d_model * self.qk_dim_factor)

    @property
    def v_dim(self) -> int:
        return int(self.d_model * self.v_dim_factor)

    @property
    def ffn_dim(self) -> int:
        # transformers' rounding, which for a fractional width is not quite a ceiling
        multiple = self.ffn_round_up_to_multiple_of
        return int((self.d_model * self.ffn_proj_factor + multiple - 1) // multiple * multiple)


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else cap * torch.tanh(x / cap)


def soft_cap_(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """`soft_cap` in place where nothing needs its graph: a step's (rows, vocabulary) logits, one pass each over
    them instead of three new tensors (9% of a 64-row decode step went to capping the logits)."""
    if cap is None or x.requires_grad:
        return soft_cap(x, cap)
    return x.div_(cap).tanh_().mul_(cap)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_normalise(x, self.eps).to(x.dtype) * self.weight
        return y if self.bias is None else y + self.bias


class MultiHeadLayerNorm(nn.Module):
    """A layer norm over each head's values, with one weight (and bias) vector across all heads."""

    def __init__(self, n_heads: int, head_dim: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_heads * head_dim))
        self.bias = nn.Parameter(torch.zeros(n_heads * head_dim)) if bias else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(T, H, Dv) float32 (or float64) -> (T, H * Dv) in the weight's dtype."""
        y = F.layer_norm(h, h.shape[-1:], eps=self.eps).flatten(-2).to(self.weight.dtype) * self.weight
        return y if self.bias is None else y + self.bias


class MLSTMLayer(nn.Module):
    def __init__(self, config: XLSTMConfig):
        super().__init__()
        c = self.config = config
        d, bias = c.d_model, c.use_bias
        if c.weight_mode == "single":
            self.q = nn.Linear(d, c.qk_dim, bias=bias)
            self.k = nn.Linear(d, c.qk_dim, bias=bias)
            self.v = nn.Linear(d, c.v_dim, bias=bias)
            self.ogate_preact = nn.Linear(d, c.v_dim, bias=bias)
            self.igate_preact = nn.Linear(d, c.n_heads, bias=True)
            self.fgate_preact = nn.Linear(d, c.n_heads, bias=True)
        else:  # [q; k; v; o] and [i; f] stacked along the output
            self.qkv_opreact = nn.Linear(d, 2 * c.qk_dim + 2 * c.v_dim, bias=bias)
            self.ifgate_preact = nn.Linear(d, 2 * c.n_heads, bias=True)
        self.multihead_norm = MultiHeadLayerNorm(c.n_heads, c.v_dim // c.n_heads, c.norm_eps, bias)
        self.out_proj = nn.Linear(c.v_dim, d, bias=bias)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(T, D) -> q, k (T, qk_dim), v, o (T, v_dim), i, f (T, H)."""
        c = self.config
        if c.weight_mode == "single":
            q, k, v, o = self.q(x), self.k(x), self.v(x), self.ogate_preact(x)
            i, f = self.igate_preact(x), self.fgate_preact(x)
        else:
            q, k, v, o = self.qkv_opreact(x).split([c.qk_dim, c.qk_dim, c.v_dim, c.v_dim], dim=-1)
            i, f = self.ifgate_preact(x).split([c.n_heads, c.n_heads], dim=-1)
        return q, k, v, o, soft_cap(i, c.gate_soft_cap), soft_cap(f, c.gate_soft_cap)

    def forward(self, x: torch.Tensor, state: SlotState, block: int, parts) -> torch.Tensor:
        """(T, D) packed tokens -> (T, D); each sequence's state of this `block` read from its slot and written
        back. `parts`: `split_decodes` of the step."""
        q, k, v, o, i, f = self._project(x)
        h = run_by_parts(parts, lambda part, *qkvif: self._cell(*qkvif, state, block, part), q, k, v, i, f)
        h = self.multihead_norm(h)  # (T, v_dim) in the model's dtype
        return self.out_proj(torch.sigmoid(o) * h)

    def _cell(self, q, k, v, i, f, state: SlotState, block: int, part: StepBatch) -> torch.Tensor:
        """The mLSTM over one part's packed tokens -> h (T, H, Dv); the part's slots updated in place."""
        c = self.config
        where = (part.slots, block)
        fused = kernels.fused_state_steps(state["C"]) if part.max_query_len == 1 else None
        if fused is not None:  # the memory C read and written once, in its slots; n and m are small
            rows = q.shape[0]
            h, state["n"][where], state["m"][where] = fused.mlstm_step_(
                state["C"][:, block], state["n"][:, block], state["m"][:, block], part.slots,
                *(t.view(rows, c.n_heads, -1) for t in (q, k, v)), i, f, c.eps)
            return h
        old = tuple(state[name][where] for name in STATE_NAMES)  # each (B, H, ...)
        dtype = old[0].dtype  # float32, or float64 in tests

        def heads(t: torch.Tensor, fill: float = 0.0) -> torch.Tensor:  # (T, H * d) or (T, H) -> (B, H, Q, d)
            return part.pad(t.to(dtype).view(t.shape[0], c.n_heads, -1), fill).transpose(1, 2)  # or (B, H, Q, 1)

        # padding: no input (i = -inf), nothing forgotten (log sigmoid(+inf) = 0), so the state stays as it was
        i, f = heads(i, float("-inf")).squeeze(-1), heads(f, float("inf")).squeeze(-1)
        h, new = mlstm.sequence(heads(q), heads(k), heads(v), i, f, old, c.eps, c.chunk_size)
        for name, tensor in zip(STATE_NAMES, new):
            state[name][where] = tensor
        return part.unpad(h.transpose(1, 2))


class FeedForward(nn.Module):
    """SwiGLU: proj_down(silu(gate) * up)."""

    def __init__(self, config: XLSTMConfig):
        super().__init__()
        self.fused = config.weight_mode == "fused"
        d, width, bias = config.d_model, config.ffn_dim, config.use_bias
        if self.fused:
            self.proj_up_gate_z = nn.Linear(d, 2 * width, bias=bias)  # [gate; up]
        else:
            self.proj_up_gate = nn.Linear(d, width, bias=bias)
            self.proj_up = nn.Linear(d, width, bias=bias)
        self.proj_down = nn.Linear(width, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.proj_up_gate_z(x).chunk(2, dim=-1)
        else:
            gate, up = self.proj_up_gate(x), self.proj_up(x)
        return self.proj_down(F.silu(gate) * up)


class XLSTMBlock(nn.Module):
    def __init__(self, config: XLSTMConfig):
        super().__init__()
        self.norm_mlstm = RMSNorm(config.d_model, config.norm_eps, config.use_bias)
        self.mlstm_layer = MLSTMLayer(config)
        self.norm_ffn = RMSNorm(config.d_model, config.norm_eps, config.use_bias)
        self.ffn = FeedForward(config)

    def forward(self, x: torch.Tensor, state: SlotState, index: int, parts) -> torch.Tensor:
        x = x + self.mlstm_layer(self.norm_mlstm(x), state, index, parts)
        return x + self.ffn(self.norm_ffn(x))


class XLSTMBackbone(nn.Module):
    def __init__(self, config: XLSTMConfig):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(XLSTMBlock(config) for _ in range(config.n_blocks))
        # transformers' out_norm has no bias, even with use_bias
        self.out_norm = RMSNorm(config.d_model, config.norm_eps, bias=False)


class XLSTMLanguageModel(SlotLanguageModel):
    def __init__(self, config: XLSTMConfig):
        super().__init__()
        self.config = config
        self.backbone = XLSTMBackbone(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def _state_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        heads, dk, dv = c.n_heads, c.qk_dim // c.n_heads, c.v_dim // c.n_heads
        return {"C": (c.n_blocks, heads, dk, dv), "n": (c.n_blocks, heads, dk), "m": (c.n_blocks, heads)}

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        """Per slot and block: C (H, Dk, Dv), n (H, Dk), m (H). Float32 at least, whatever `dtype` (the model's by
        default): the memory sums exponentially gated updates over the whole history, which bfloat16 loses."""
        weight = self.lm_head.weight
        dtype = torch.promote_types(dtype or weight.dtype, torch.float32)
        return SlotState({name: torch.zeros((num_slots, *shape), dtype=dtype, device=weight.device)
                          for name, shape in self._state_shapes().items()})

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.backbone.out_norm(x)).float()  # a new tensor: no one else reads it
        return soft_cap_(logits, self.config.output_logit_soft_cap)

    def _hidden(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        """(T, D) top hidden states of the step's tokens; the slots updated in place, one block at a time (for
        xLSTM-7b a block's C is 4 MiB a sequence, the whole state 128 MiB)."""
        parts = split_decodes(batch)
        x = self.backbone.embeddings(batch.token_ids)
        for index, block in enumerate(self.backbone.blocks):
            x = block(x, state, index, parts)
        return x


# ---- config.json ------------------------------------------------------------------------

# What transformers' xLSTMConfig assumes for a key config.json leaves out.
HF_DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 4096, "embedding_dim": None, "num_hidden_layers": 32, "num_blocks": None,
    "num_heads": 8, "use_bias": False, "tie_word_embeddings": False, "add_out_norm": True, "norm_eps": 1e-6,
    "qk_dim_factor": 0.5, "v_dim_factor": 1.0, "mode": "inference", "chunk_size": 64, "eps": 1e-6,
    "ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64, "gate_soft_cap": 15.0,
    "output_logit_soft_cap": 30.0, "weight_mode": "single",
}
# Every mode computes the same function (they differ in the kernels that run it and in what they return).
MODES = ("inference", "train", "train_with_padding")


def read_hf_config(raw: dict) -> XLSTMConfig:
    """transformers' xLSTM config.json (defaults filled in) -> XLSTMConfig.

    Kernel choices (chunkwise_kernel, sequence_kernel, step_kernel), autocast_kernel_dtype,
    inference_state_dtype and norm_reduction_force_float32 only say how the original computes the
    same function: Quill runs its own PyTorch forms, the cell and the norms' reductions in float32.
    """
    width = raw["hidden_size"] if raw["hidden_size"] is not None else raw["embedding_dim"]
    if raw["embedding_dim"] is not None and raw["embedding_dim"] != width:
        raise ValueError(f"embedding_dim {raw['embedding_dim']} differs from hidden_size {width}: transformers "
                         "would build embeddings of one width and blocks of the other")
    if raw["tie_word_embeddings"]:
        raise ValueError("tie_word_embeddings is not supported: transformers' xLSTMForCausalLM does not tie its "
                         "lm_head to the embeddings")
    if not raw["add_out_norm"]:
        raise ValueError("add_out_norm false is not supported: the xlstm package then skips the final norm, "
                         "transformers applies it anyway")
    if raw["mode"] not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {raw['mode']!r}")
    return XLSTMConfig(
        vocab_size=raw["vocab_size"], d_model=width,
        n_blocks=raw["num_blocks"] if raw["num_blocks"] is not None else raw["num_hidden_layers"],
        n_heads=raw["num_heads"], qk_dim_factor=raw["qk_dim_factor"], v_dim_factor=raw["v_dim_factor"],
        ffn_proj_factor=raw["ffn_proj_factor"], ffn_round_up_to_multiple_of=raw["ffn_round_up_to_multiple_of"],
        use_bias=raw["use_bias"], weight_mode=raw["weight_mode"], norm_eps=raw["norm_eps"], eps=raw["eps"],
        gate_soft_cap=raw["gate_soft_cap"], output_logit_soft_cap=raw["output_logit_soft_cap"],
        chunk_size=raw["chunk_size"], extra={"hf_model_type": raw["model_type"]},
    )
