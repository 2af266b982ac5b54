"""Decoder-only Transformer covering our own default, GPT-2 and the Llama family.

One configuration spans the designs: learned positions + LayerNorm + GELU MLP (GPT-2),
or rotary positions + RMSNorm + gated MLP + grouped-query attention (Llama), with the
small departures of Llama's relatives as switches: bias on q, k, v only (Qwen2), a
per-head RMSNorm of q and k (Qwen3), scaled embeddings and a (1 + w) RMSNorm (Gemma).
The original Transformer's layout is switches too (PyTorch's nn.TransformerEncoderLayer, as
word_language_model uses it): a norm after each residual add and none at the end (`post_norm`,
`final_norm`), fixed sinusoidal positions, a ReLU MLP with biases, a bias on the output layer.

State per sequence: K and V of every layer in fixed-size blocks of a `PagedKVCache`;
a step writes the new tokens' K,V into their slots, then attends over the blocks
listed in each sequence's block table, through the attention backend the cache was
allocated with (quill/models/attention: gather + SDPA, or a Triton kernel reading blocks in place).
A step's norms, RoPE and gated activation go through the layer ops the model was loaded with
(quill/models/kernels: eager PyTorch, or fused Triton kernels); `forward` always runs them eagerly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import PagedAttentionBackend, select_attention_backend
from ..batch import StepBatch
from ..kernels import TORCH_OPS, LayerOps
from ..kernels.torch_ops import ACTIVATIONS
from ..state import PagedKVCache

ROPE_SCALING_TYPES = ("default", "linear", "llama3")


def rope_scaling_type(scaling: dict | None) -> str:
    """The kind of RoPE rescaling, under either of the names Hugging Face configs have used for it."""
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


@dataclass
class TransformerConfig:
    vocab_size: int
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # fewer than n_heads: grouped-query attention
    head_dim: int | None = None  # default d_model // n_heads
    d_ff: int | None = None  # default 4 * d_model, or 8/3 of it for a gated MLP
    max_seq_len: int = 256  # context window
    positional: str = "rope"  # "rope" | "learned" | "sinusoidal" (fixed, added to the embeddings: Vaswani et al.)
    norm: str = "rmsnorm"  # a key of NORMS: "rmsnorm" | "rmsnorm_unit_offset" | "layernorm"
    norm_eps: float = 1e-5
    post_norm: bool = False  # norm(x + sublayer(x)), the original Transformer; default pre-norm x + sublayer(norm(x))
    final_norm: bool = True  # a norm before the output layer (post-norm stacks have none)
    gated_mlp: bool = True  # SwiGLU-style: act(gate(x)) * up(x)
    activation: str = "silu"
    attn_bias: bool = False
    attn_out_bias: bool | None = None  # None: same as attn_bias (Qwen2 has bias on q, k, v only)
    qk_norm: bool = False  # normalise each head's q and k before RoPE (Qwen3)
    mlp_bias: bool = False
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(d_model))
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", "factor": ..., ...}
    tie_embeddings: bool = True
    output_bias: bool = False  # a bias on the output layer's logits (`lm_bias`)
    dropout: float = 0.0  # training only
    extra: dict = field(default_factory=dict)  # provenance (e.g. the Hugging Face class it came from)

    def __post_init__(self):
        self.n_kv_heads = self.n_kv_heads or self.n_heads
        self.head_dim = self.head_dim or self.d_model // self.n_heads
        if self.attn_out_bias is None:
            self.attn_out_bias = self.attn_bias
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model if not self.gated_mlp else 64 * math.ceil(8 * self.d_model / 3 / 64)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        for name, value, allowed in [
            ("positional", self.positional, ("rope", "learned", "sinusoidal")),
            ("norm", self.norm, tuple(NORMS)),
            ("activation", self.activation, tuple(ACTIVATIONS)),
            ("rope_scaling type", rope_scaling_type(self.rope_scaling), ROPE_SCALING_TYPES),
        ]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {value!r}")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, not {self.d_model}")


def rms_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x over its root mean square along the last dimension, computed in float32 (float64 stays float64)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Normalises in float32 whatever the weights' dtype, as Llama does."""

    unit_offset = False  # read by the fused kernel (quill/models/kernels/rms_norm.py)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalise(x, self.eps).to(x.dtype)


class UnitOffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the stored weight w scales by (1 + w), so zeros are the identity.

    The scaling happens in float32 before the cast back: in 16-bit weights, 1 + w
    would lose most of w's bits.
    """

    unit_offset = True

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalise(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype)


NORMS = {"rmsnorm": RMSNorm, "rmsnorm_unit_offset": UnitOffsetRMSNorm, "layernorm": nn.LayerNorm}


def make_norm(config: TransformerConfig, dim: int | None = None) -> nn.Module:
    """The configured norm over `dim` features (default d_model)."""
    return NORMS[config.norm](dim or config.d_model, eps=config.norm_eps)


def rope_inv_freq(config: TransformerConfig, device) -> torch.Tensor:
    """(head_dim / 2,) rotation frequencies, with Llama's long-context rescaling if configured."""
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    scaling = config.rope_scaling or {}
    kind = rope_scaling_type(scaling)
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r}")


def rope_tables(config: TransformerConfig, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (...,) -> cos, sin (..., head_dim), halves repeated as in rotate-half RoPE."""
    freqs = positions.float()[..., None] * rope_inv_freq(config, positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def sinusoidal_positions(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """positions (...,) -> (..., dim) float32: sin in even features, cos in odd, at wavelengths from 2 pi to
    10000 * 2 pi; computed from the positions (no table to outgrow), in the operations and order of PyTorch's
    word_language_model PositionalEncoding, so its stored `pe` rows come out bit for bit."""
    div_term = torch.exp(torch.arange(0, dim, 2, device=positions.device).float() * (-math.log(10000.0) / dim))
    angles = positions.float()[..., None] * div_term  # (..., dim / 2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        c = config
        self.qkv = nn.Linear(c.d_model, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, bias=c.attn_bias)
        self.out = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=c.attn_out_bias)
        # One norm over head_dim shared by all heads (Qwen3), applied before RoPE.
        self.q_norm = make_norm(c, c.head_dim) if c.qk_norm else None
        self.k_norm = make_norm(c, c.head_dim) if c.qk_norm else None

    def project(self, x: torch.Tensor, rope, ops: LayerOps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., T, D) -> q (..., T, H, hd), k and v (..., T, KVH, hd)."""
        c = self.config
        q, k, v = ops.linear(x, self.qkv.weight, self.qkv.bias).split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim], -1)
        q = q.unflatten(-1, (c.n_heads, c.head_dim))
        k = k.unflatten(-1, (c.n_kv_heads, c.head_dim))
        v = v.unflatten(-1, (c.n_kv_heads, c.head_dim))
        if self.q_norm is not None:
            q, k = ops.norm(q, self.q_norm), ops.norm(k, self.k_norm)
        if rope is not None:
            q, k = ops.rope(q, k, *rope)
        return q, k, v

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        """Full causal attention over x (B, T, D), no cache."""
        q, k, v = self.project(x, rope, TORCH_OPS)  # (B, T, H or KVH, hd)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=True, enable_gqa=self.config.n_kv_heads != self.config.n_heads,
        )  # (B, H, T, hd)
        return self.out(out.transpose(1, 2).flatten(-2))

    def step(self, x: torch.Tensor, rope, k_cache, v_cache, attention: PagedAttentionBackend,
             ops: LayerOps) -> torch.Tensor:
        """x (T, D) packed new tokens; k_cache/v_cache (num_blocks, block_size, KVH, hd) of this layer."""
        q, k, v = self.project(x, rope, ops)
        attended = attention.forward(q, k, v, k_cache, v_cache)  # the backend writes k, v into the cache
        return ops.linear(attended, self.out.weight, self.out.bias)


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gated = config.gated_mlp
        width = 2 * config.d_ff if self.gated else config.d_ff
        self.up = nn.Linear(config.d_model, width, bias=config.mlp_bias)  # gated: [gate; up]
        self.down = nn.Linear(config.d_ff, config.d_model, bias=config.mlp_bias)
        self.activation = config.activation

    def forward(self, x: torch.Tensor, ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        if self.gated:
            h = ops.gated_act(ops.linear(x, self.up.weight, self.up.bias), self.activation)
        else:
            h = ops.linear_act(x, self.up.weight, self.up.bias, self.activation)
        return ops.linear(h, self.down.weight, self.down.bias)


class Block(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = Attention(config)
        self.mlp_norm = make_norm(config)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)
        # Post-norm: attn_norm follows the attention's residual add, mlp_norm the MLP's.
        self.post_norm = config.post_norm

    def forward(self, x, rope):
        if self.post_norm:
            x = self.attn_norm(x + self.drop(self.attn(x, rope)))
            return self.mlp_norm(x + self.drop(self.mlp(x)))
        x = x + self.drop(self.attn(self.attn_norm(x), rope))
        return x + self.drop(self.mlp(self.mlp_norm(x)))

    def step(self, x, rope, k_cache, v_cache, attention, ops: LayerOps, reduce=None):
        """`reduce`: sums the ranks' partial outputs of the attention and the MLP (tensor parallel; None: whole)."""
        if self.post_norm:
            # add_norm's first result is norm(x + h): the post-norm residual. Fused where the ops fuse the norm
            # (RMSNorm); a LayerNorm, as PyTorch's encoder layer has, runs as torch ops under any LayerOps.
            h = self.attn.step(x, rope, k_cache, v_cache, attention, ops)
            x, _ = ops.add_norm(h if reduce is None else reduce(h), x, self.attn_norm)
            h = self.mlp(x, ops)
            x, _ = ops.add_norm(h if reduce is None else reduce(h), x, self.mlp_norm)
            return x
        h = self.attn.step(ops.norm(x, self.attn_norm), rope, k_cache, v_cache, attention, ops)
        h, x = ops.add_norm(h if reduce is None else reduce(h), x, self.mlp_norm)  # x + h, mlp_norm(x + h)
        h = self.mlp(h, ops)
        return x + (h if reduce is None else reduce(h))


class TransformerLanguageModel(nn.Module):
    state_kind = PagedKVCache.kind

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_seq_len, config.d_model) if config.positional == "learned" else None
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = make_norm(config) if config.final_norm else None
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.output_bias else None
        self.drop = nn.Dropout(config.dropout)
        # How steps read the paged cache: a key of models.attention.ATTENTION_BACKENDS, or "auto" for the
        # default of the device the cache is allocated on. Resolved by new_state, carried by the cache.
        self.attention_backend = "auto"
        # How steps run norms, RoPE and the gated activation (models.kernels); load_checkpoint picks the device's.
        self.layer_ops: LayerOps = TORCH_OPS
        # One rank's shard of a tensor-parallel model: its steps' collectives (models.parallel.hooks.TensorParallel,
        # set by models.parallel.shard_loading); None: the whole model, whose steps call none.
        self.parallel = None

    def init_weights(self) -> None:
        """GPT-2 style initialisation for training from scratch (residual outputs scaled by depth)."""
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * self.config.n_layers) if name.endswith(("out.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor):
        x = self.embed(tokens) if self.parallel is None else self.parallel.embed(self.embed.weight, tokens)
        if self.config.embed_scale != 1.0:
            # The scale is rounded to the weights' dtype first, as Gemma's reference does (filled on the
            # device, not copied from the host: a CUDA graph can capture a fill).
            x = x * x.new_full((), self.config.embed_scale)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
            return x, None
        if self.config.positional == "sinusoidal":
            return x + sinusoidal_positions(positions, self.config.d_model).to(x.dtype), None
        return x, rope_tables(self.config, positions, x.dtype)

    def _logits(self, h: torch.Tensor, ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        if self.norm is not None:
            h = ops.norm(h, self.norm)
        logits = ops.linear(h, weight, self.lm_bias).float()
        return logits if self.parallel is None else self.parallel.logits(logits)  # a shard's: on rank 0, else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits, no cache."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x, rope = self._embed(tokens, positions)
        x = self.drop(x)
        for layer in self.layers:
            x = layer(x, rope)
        return self._logits(x)

    def new_state(self, num_blocks: int, block_size: int = 16, dtype: torch.dtype | None = None,
                  attention_backend: str | None = None) -> PagedKVCache:
        """A cache on the model's device, read by `attention_backend` (None: the model's `attention_backend`)."""
        c = self.config
        like = self.embed.weight
        backend = select_attention_backend(attention_backend or self.attention_backend, like.device)
        return PagedKVCache(c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim, dtype or like.dtype,
                            like.device, attention=backend)

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: PagedKVCache) -> torch.Tensor:
        """Run the new tokens of each sequence against its cached K,V; write their K,V in place."""
        attention = state.attention.build(batch, state.block_size)  # once per step, shared by the layers
        x, rope = self._embed(batch.token_ids, batch.positions)
        reduce = None if self.parallel is None else self.parallel.reduce
        for i, layer in enumerate(self.layers):
            x = layer.step(x, rope, state.k[i], state.v[i], attention, self.layer_ops, reduce)
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]
        return self._logits(x, self.layer_ops)
