"""LFM2 (Liquid AI): a hybrid of gated short convolutions and grouped-query attention, read from Hugging Face
`Lfm2ForCausalLM` checkpoints as they are.

Most layers are a gated short convolution: in_proj makes B, C and x; B * x goes through a causal depthwise
convolution of `conv_kernel` taps (conv_L_cache, 3 in the released models); C gates its output; out_proj maps it
back. The other layers are attention with an RMSNorm of each head's q and k before RoPE. Every layer is pre-norm
with a SwiGLU feed-forward; the norm called `embedding_norm` is the final one, before the output layer (tied to
the embeddings in the released models). The attention and feed-forward are the Transformer's own modules
(`transformer_view` configures them), with q/k/v and w1/w3 fused into one matmul each as the family's tensor table
loads them (hf_families.LFM2_TENSORS), and run the Transformer's paged-attention backends, RoPE and layer ops.

State per sequence, of two kinds (a `HybridState`):
- convolution windows, in a slot: each conv layer's last conv_kernel - 1 inputs B * x, (n_conv, K - 1, d_model).
  Kept in the model's dtype: they are inputs the convolution reads again, not a sum that accumulates, so storing
  them in the dtype they were made in loses nothing.
- K and V of the attention layers only, in paged blocks, through the Transformer's attention backends.

LFM2-350M (d_model 1024, 16 layers of which 6 attention, 16 heads of 64, 8 KV heads, conv_L_cache 3), in bf16:
per sequence, 10 conv layers x 2 inputs x 1024 channels x 2 bytes = 40,960 bytes (40 KiB) of windows; per token,
6 layers x (K + V) x 8 heads x 64 x 2 bytes = 12,288 bytes (12 KiB) of K,V, 6/16 of a 16-layer all-attention
stack's. The whole conv state weighs as much as 3.3 tokens of K,V. (float32: twice each.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import select_attention_backend
from ..batch import StepBatch, run_by_parts, split_decodes
from ..kernels import TORCH_OPS, LayerOps
from ..loading.rope_config import read_rope
from ..state import HybridState, PagedKVCache, SlotState
from .transformer import MLP, Attention, RMSNorm, TransformerConfig, rope_tables

LAYER_TYPES = ("conv", "full_attention")


@dataclass
class Lfm2Config:
    """head_dim, rope_theta and rope_scaling are named as in TransformerConfig: models.transformer's rope_tables
    reads them."""

    vocab_size: int
    d_model: int = 256
    layer_types: list[str] = field(default_factory=lambda: ["conv", "full_attention"])  # one per layer
    n_heads: int = 4
    n_kv_heads: int | None = None  # fewer than n_heads: grouped-query attention
    head_dim: int | None = None  # default d_model // n_heads
    d_ff: int = 512  # SwiGLU width, after the checkpoint's rounding rule (read_config applies it)
    conv_kernel: int = 3  # taps of the causal depthwise convolution (Hugging Face: conv_L_cache)
    conv_bias: bool = False  # biases on in_proj, the convolution and out_proj
    norm_eps: float = 1e-5
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", "factor": ..., ...}
    max_seq_len: int = 128_000  # context window (max_position_embeddings)
    tie_embeddings: bool = True
    extra: dict = field(default_factory=dict)  # provenance (e.g. the Hugging Face model_type)

    def __post_init__(self):
        self.layer_types = list(self.layer_types)
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"layer_types {unknown} are not implemented (supported: {', '.join(LAYER_TYPES)})")
        if self.conv_kernel < 1:
            raise ValueError(f"conv_kernel (conv_L_cache) must be at least 1, not {self.conv_kernel}")
        # The Transformer's config fills in the heads' defaults and checks them and the RoPE scaling.
        shared = self.transformer_view()
        self.n_kv_heads, self.head_dim = shared.n_kv_heads, shared.head_dim

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    @property
    def n_conv_layers(self) -> int:
        return self.layer_types.count("conv")

    @property
    def n_attention_layers(self) -> int:
        return self.n_layers - self.n_conv_layers

    def transformer_view(self) -> TransformerConfig:
        """The Transformer's config of LFM2's attention (grouped-query heads, RMSNorm of q and k before RoPE) and
        feed-forward (SwiGLU, no biases), so that the layers use the Transformer's modules."""
        return TransformerConfig(
            vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, d_ff=self.d_ff, max_seq_len=self.max_seq_len,
            norm="rmsnorm", norm_eps=self.norm_eps, qk_norm=True, gated_mlp=True, activation="silu",
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling)


def read_config(raw: dict) -> Lfm2Config:
    """An `Lfm2Config` from config.json (defaults filled in), renamings and sizing as transformers' Lfm2Config."""
    theta, scaling = read_rope(raw)
    n_layers = raw["num_hidden_layers"]
    layer_types = raw.get("layer_types")
    if layer_types is None:  # older configs list the attention layers; none listed means all are attention
        attention = raw.get("full_attn_idxs")
        attention = range(n_layers) if attention is None else attention
        layer_types = ["full_attention" if i in attention else "conv" for i in range(n_layers)]
    if len(layer_types) != n_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {n_layers} layers")
    d_ff = raw.get("block_ff_dim", raw["intermediate_size"])
    if raw["block_auto_adjust_ff_dim"]:  # 2/3 of the nominal width, scaled, rounded up to a multiple
        d_ff = int(2 * d_ff / 3)
        if raw["block_ffn_dim_multiplier"] is not None:
            multiple = raw["block_multiple_of"]
            d_ff = multiple * -(-int(raw["block_ffn_dim_multiplier"] * d_ff) // multiple)
    return Lfm2Config(
        vocab_size=raw["vocab_size"], d_model=raw["hidden_size"], layer_types=layer_types,
        n_heads=raw["num_attention_heads"], n_kv_heads=raw["num_key_value_heads"], head_dim=raw.get("head_dim"),
        d_ff=d_ff, conv_kernel=raw["conv_L_cache"], conv_bias=raw["conv_bias"], norm_eps=raw["norm_eps"],
        rope_theta=theta, rope_scaling=scaling, max_seq_len=raw["max_position_embeddings"],
        tie_embeddings=raw.get("tie_embedding", raw["tie_word_embeddings"]),
        extra={"hf_model_type": raw["model_type"]},
    )


# What transformers' Lfm2Config assumes for a key config.json leaves out (rope_theta: its default_theta).
DEFAULTS = {
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128_000, "norm_eps": 1e-5,
    "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "conv_bias": False, "conv_L_cache": 3,
    "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
}


class ShortConv(nn.Module):
    """Gated short convolution: out_proj(C * causal_conv(B * x)), with B, C, x = in_proj(h)."""

    def __init__(self, config: Lfm2Config):
        super().__init__()
        d, bias = config.d_model, config.conv_bias
        self.in_proj = nn.Linear(d, 3 * d, bias=bias)
        # Holds the taps (d, 1, K) under the checkpoint's name; `convolve` applies them.
        self.conv = nn.Conv1d(d, d, kernel_size=config.conv_kernel, groups=d, bias=bias)
        self.out_proj = nn.Linear(d, d, bias=bias)

    @property
    def window(self) -> int:
        """How many past inputs the next output reads."""
        return self.conv.kernel_size[0] - 1

    def gated_inputs(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h (..., D) -> the convolution's input B * x and the output gate C, (..., D) each."""
        b, c, x = self.in_proj(h).chunk(3, dim=-1)
        return b * x, c

    def convolve(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs (B, K - 1 + Q, D): the window then Q new inputs -> (B, Q, D) outputs at the new inputs.

        A sum over the taps, accumulated in float32: each output is the same operations on the same K inputs
        whichever chunk it falls in, so prefill in chunks equals one pass.
        """
        taps = self.conv.weight[:, 0].float()  # (D, K)
        q = inputs.shape[1] - self.window
        out = inputs[:, :q].float() * taps[:, 0]
        for k in range(1, taps.shape[1]):
            out = out + inputs[:, k : k + q].float() * taps[:, k]
        if self.conv.bias is not None:
            out = out + self.conv.bias.float()
        return out.to(inputs.dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (B, T, D) from the empty state (a window of zeros)."""
        inputs, gate = self.gated_inputs(h)
        return self.out_proj(gate * self.convolve(F.pad(inputs, (0, 0, self.window, 0))))

    def step(self, h: torch.Tensor, parts, windows: torch.Tensor, layer: int) -> torch.Tensor:
        """h (T, D) packed new tokens -> (T, D). `parts`: the step's sequences as `split_decodes` groups them;
        `windows`: the state's conv windows (slots, n_conv, K - 1, D), this conv `layer`'s read for each part's
        slots and written back as their last K - 1 real inputs, never padding. The projections run on the packed
        tokens and only the convolution on a part's sequences side by side, padded to its longest: a decode row
        never pays for a prefill chunk's padding."""
        inputs, gate = self.gated_inputs(h)
        out = run_by_parts(parts, lambda part, inputs: self._convolve_part(inputs, part, windows, layer), inputs)
        return self.out_proj(gate * out)

    def _convolve_part(self, inputs: torch.Tensor, part: StepBatch, windows: torch.Tensor, layer: int):
        seq = part.slide_windows(windows, (part.slots, layer), part.pad(inputs))  # (B, K - 1 + Q, D)
        return part.unpad(self.convolve(seq))


class Layer(nn.Module):
    """x + operator(operator_norm(x)), then + feed_forward(ffn_norm(.)); the operator is `conv` or `self_attn`."""

    def __init__(self, config: Lfm2Config, layer_type: str, state_index: int, shared: TransformerConfig):
        super().__init__()
        self.is_conv = layer_type == "conv"
        self.state_index = state_index  # among the layers of its type: its conv window, or its K,V layer
        if self.is_conv:
            self.conv = ShortConv(config)
        else:
            self.self_attn = Attention(shared)
        self.feed_forward = MLP(shared)
        self.operator_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        h = self.operator_norm(x)
        x = x + (self.conv(h) if self.is_conv else self.self_attn(h, rope))
        return x + self.feed_forward(self.ffn_norm(x))


class Lfm2LanguageModel(nn.Module):
    state_kind = HybridState.kind

    def __init__(self, config: Lfm2Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        types, shared = config.layer_types, config.transformer_view()
        self.layers = nn.ModuleList(Layer(config, kind, types[:i].count(kind), shared) for i, kind in enumerate(types))
        self.embedding_norm = RMSNorm(config.d_model, config.norm_eps)  # the final norm, despite its name
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        # As the Transformer's: an attention backend name ("auto": the device's default), resolved by new_state,
        # and the layer ops its steps run norms and RoPE through.
        self.attention_backend = "auto"
        self.layer_ops: LayerOps = TORCH_OPS

    def _logits(self, x: torch.Tensor, ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return ops.linear(ops.norm(x, self.embedding_norm), weight, None).float()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, from an empty state."""
        x = self.embed_tokens(tokens)
        rope = rope_tables(self.config, torch.arange(tokens.shape[1], device=tokens.device), x.dtype)
        for layer in self.layers:
            x = layer(x, rope)
        return self._logits(x)

    def new_state(self, num_blocks: int, num_slots: int, block_size: int = 16, dtype: torch.dtype | None = None,
                  attention_backend: str | None = None) -> HybridState:
        """K,V blocks for the attention layers, read by `attention_backend` (None: the model's), and one slot per
        sequence of conv windows, "conv" (num_slots, n_conv_layers, conv_kernel - 1, d_model); both in `dtype`
        (None: the model's)."""
        c = self.config
        like = self.embed_tokens.weight
        dtype = dtype or like.dtype
        backend = select_attention_backend(attention_backend or self.attention_backend, like.device)
        kv = PagedKVCache(c.n_attention_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim, dtype,
                          like.device, attention=backend)
        windows = torch.zeros((num_slots, c.n_conv_layers, c.conv_kernel - 1, c.d_model), dtype=dtype,
                              device=like.device)
        return HybridState(kv, SlotState({"conv": windows}))

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: HybridState) -> torch.Tensor:
        """Run each sequence's new tokens from its conv slot and its cached K,V; update both in place."""
        ops, kv = self.layer_ops, state.kv
        attention = kv.attention.build(batch, kv.block_size)  # once per step, shared by the attention layers
        parts = split_decodes(batch)  # and the conv layers' parts
        x = self.embed_tokens(batch.token_ids)  # (T, D)
        rope = rope_tables(self.config, batch.positions, x.dtype)
        for layer in self.layers:
            h = ops.norm(x, layer.operator_norm)
            if layer.is_conv:
                h = layer.conv.step(h, parts, state.slots["conv"], layer.state_index)
            else:
                i = layer.state_index
                h = layer.self_attn.step(h, rope, kv.k[i], kv.v[i], attention, ops)
            h, x = ops.add_norm(h, x, layer.ffn_norm)  # x = x + h, h = ffn_norm(x)
            x = x + layer.feed_forward(h, ops)
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]
        return self._logits(x, ops)
