"""Encoder-decoder Transformer (Vaswani et al. 2017) as translation and summarization checkpoints ship it: Marian
(OPUS-MT), BART and mBART, M2M100 and NLLB-200, T5, mT5 and umT5.

One configuration spans them, their departures as switches: post-norm layers (Marian, BART) or pre-norm with a
final norm (mBART, M2M100, T5); sinusoidal positions in Marian's layout (sines then cosines, wavelengths over d) or
fairseq's (over d/2 - 1, positions from the padding id + 1), learned positions read two rows on (BART), or none
but T5's relative-position bias on every score (quill/models/attention/relative_bias.py, with no 1/sqrt(d) scale);
a norm of the embeddings (BART); embeddings scaled by sqrt(d); a bias on the logits (Marian, BART); RMS norms,
linear layers without biases, a gated feed-forward and the output scaled by 1/sqrt(d) before tied logits (T5); a
bias table in every layer's self-attention rather than the first layer's for all (umT5).

State: the encoder runs once per request (`encode`, sources of many requests packed in one pass) and writes every
decoder layer's cross-attention K,V into blocks of the state's `EncoderCache`, which each sequence of the request
reads (quill/models/attention/cross.py); the decoder's self-attention K,V go into paged blocks as a decoder-only
Transformer's do, through the same attention backends. A decoder step (`step`) runs its new tokens against both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import select_attention_backend
from ..attention.cross import CrossAttention
from ..attention.relative_bias import RelativeBias, RelativeBiasAttention
from ..batch import StepBatch
from ..host_copy import to_device
from ..kernels import TORCH_OPS, LayerOps
from ..kernels.torch_ops import ACTIVATIONS
from ..state import EncoderCache, EncoderDecoderState, PagedKVCache
from .transformer import RMSNorm

POSITIONALS = ("sinusoidal", "sinusoidal_fairseq", "learned", "none")
NORMS = ("layernorm", "rmsnorm")


@dataclass
class Seq2SeqConfig:
    vocab_size: int  # the decoder's (target) vocabulary
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    n_heads: int = 8
    encoder_ffn: int = 2048
    decoder_ffn: int = 2048
    max_source_len: int = 512  # longest source the encoder's positions reach
    max_seq_len: int = 512  # longest decoder sequence (its prompt and output)
    activation: str = "silu"
    pre_norm: bool = False  # x + f(norm(x)), with a final norm after each stack; False: norm(x + f(x))
    final_norm: bool = False  # a norm after the last layer of each stack (pre-norm models)
    embed_norm: bool = False  # a norm of the embeddings, positions added (BART's layernorm_embedding)
    positional: str = "sinusoidal"
    position_offset: int = 0  # position p reads row p + offset (BART: 2; fairseq: padding id + 1)
    embed_scale: float = 1.0
    norm_eps: float = 1e-5
    source_vocab_size: int | None = None  # a separate encoder vocabulary (Marian's separate_vocabs); None: shared
    tie_output: bool = True  # the output layer is the decoder's embedding
    output_bias: bool = False  # a bias on the logits (final_logits_bias)
    norm: str = "layernorm"  # or "rmsnorm" (T5: no mean subtracted, no bias)
    linear_bias: bool = True  # the attention and feed-forward layers' biases (T5 has none)
    head_size: int | None = None  # per head (T5's d_kv); None: d_model // n_heads
    attn_scale: float | None = None  # on every score; None: 1/sqrt(head size) (T5: 1)
    relative_buckets: int = 0  # T5's relative-position bias: its buckets (0: none)
    relative_max_distance: int = 128
    relative_bias_per_layer: bool = False  # each layer's self-attention its own bias table (umT5), not the stack's
    gated_ffn: bool = False  # act(x W0) * (x W1), then the output layer (T5 v1.1, Flan-T5, mT5)
    output_scale: float = 1.0  # the last hidden state is scaled by this before the logits (T5, tied: d^-1/2)
    decoder_start_token_id: int = 0
    pad_token_id: int | None = None
    forced_bos_token_id: int | None = None  # every output starts with it (BART's <s>), unless a language is forced
    extra: dict = field(default_factory=dict)  # provenance (the Hugging Face model type it came from)

    def __post_init__(self):
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, not {self.positional!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, not {self.activation!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, not {self.norm!r}")
        if self.head_size is None and (self.d_model % self.n_heads or self.d_model % 2):
            raise ValueError(f"d_model ({self.d_model}) must be even and a multiple of n_heads ({self.n_heads})")
        if self.relative_bias_per_layer and not self.relative_buckets:
            raise ValueError("relative_bias_per_layer needs relative_buckets (the tables' size)")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def inner_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5 if self.attn_scale is None else self.attn_scale


def make_norm(config: Seq2SeqConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, eps=config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


def relative_bias(config: Seq2SeqConfig, bidirectional: bool) -> RelativeBias:
    return RelativeBias(config.relative_buckets, config.n_heads, config.relative_max_distance, bidirectional)


def sinusoids(positions: torch.Tensor, dim: int, layout: str) -> torch.Tensor:
    """positions (...,) -> (..., dim) float32, sines in the first half and cosines in the second, each feature's
    wavelength as its layout computes it: Marian's (10000^(2i/dim), in float64 as its table is built) or
    fairseq's (10000^(i/(dim/2 - 1)), in float32)."""
    half = dim // 2
    if layout == "sinusoidal":
        freqs = 1.0 / 10000 ** (2 * torch.arange(half, dtype=torch.float64, device=positions.device) / dim)
        angles = positions.double()[..., None] * freqs
    else:
        freqs = torch.exp(torch.arange(half, device=positions.device).float() * -(math.log(10000) / (half - 1)))
        angles = positions.float()[..., None] * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


class Stack(nn.Module):
    """What an encoder and a decoder both have: positions, the optional embedding and final norms, layers."""

    def __init__(self, config: Seq2SeqConfig, layers: list[nn.Module], max_len: int, bidirectional: bool):
        super().__init__()
        self.config = config
        learned = config.positional == "learned"
        self.pos_embed = nn.Embedding(max_len + config.position_offset, config.d_model) if learned else None
        shared = config.relative_buckets and not config.relative_bias_per_layer
        self.rel_bias = relative_bias(config, bidirectional) if shared else None  # T5's: the first layer's
        self.embed_norm = make_norm(config) if config.embed_norm else None
        self.layers = nn.ModuleList(layers)
        self.final_norm = make_norm(config) if config.final_norm else None

    def embed(self, tokens_embedded: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = tokens_embedded * c.embed_scale if c.embed_scale != 1.0 else tokens_embedded
        if c.positional == "none":
            return self.embed_norm(x) if self.embed_norm is not None else x
        positions = positions + c.position_offset
        pos = self.pos_embed(positions) if self.pos_embed is not None else sinusoids(positions, c.d_model, c.positional)
        x = x + pos.to(x.dtype)
        return self.embed_norm(x) if self.embed_norm is not None else x


def _sublayer(x: torch.Tensor, norm: nn.Module, f, pre_norm: bool) -> torch.Tensor:
    """A residual sublayer: x + f(norm(x)) (pre-norm) or norm(x + f(x)) (post-norm)."""
    return x + f(norm(x)) if pre_norm else norm(x + f(x))


class FeedForward(nn.Module):
    def __init__(self, config: Seq2SeqConfig, width: int):
        super().__init__()
        self.gated = config.gated_ffn
        self.fc1 = nn.Linear(config.d_model, 2 * width if self.gated else width, bias=config.linear_bias)  # [W0; W1]
        self.fc2 = nn.Linear(width, config.d_model, bias=config.linear_bias)
        self.activation = config.activation

    def forward(self, x: torch.Tensor, ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        if self.gated:
            h = ops.gated_act(ops.linear(x, self.fc1.weight, self.fc1.bias), self.activation)
        else:
            h = ops.linear_act(x, self.fc1.weight, self.fc1.bias, self.activation)
        return ops.linear(h, self.fc2.weight, self.fc2.bias)


class Layer(nn.Module):
    """What a layer of either stack has: self-attention (q, k, v in one matmul; umT5: its own bias table) and a
    feed-forward, each with its norm."""

    def __init__(self, config: Seq2SeqConfig, ffn: int, bidirectional: bool):
        super().__init__()
        self.config = config
        d, inner, bias = config.d_model, config.inner_dim, config.linear_bias
        self.rel_bias = relative_bias(config, bidirectional) if config.relative_bias_per_layer else None
        self.attn_norm = make_norm(config)
        self.qkv = nn.Linear(d, 3 * inner, bias=bias)
        self.out = nn.Linear(inner, d, bias=bias)
        self.mlp_norm = make_norm(config)
        self.mlp = FeedForward(config, ffn)


class EncoderLayer(Layer):
    def __init__(self, config: Seq2SeqConfig):
        super().__init__(config, config.encoder_ffn, bidirectional=True)

    def attend(self, x: torch.Tensor, mask: torch.Tensor, real: torch.Tensor, shape: tuple[int, int],
               ops: LayerOps) -> torch.Tensor:
        """x (N, D) the sources' real tokens, packed; `real` (N,) where each sits in the padded (E, S) `shape`;
        mask (E, 1, 1, S): which keys are real (or, with T5's bias, (E, H, S, S) added to the scores). Only the
        attention itself runs padded: the linear layers see real tokens alone."""
        heads = self.config.n_heads
        qkv = ops.linear(x, self.qkv.weight, self.qkv.bias)
        padded = qkv.new_zeros(shape[0] * shape[1], qkv.shape[-1])
        padded[real] = qkv
        q, k, v = padded.view(*shape, 3, heads, -1).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                             scale=self.config.scale)
        return ops.linear(out.transpose(1, 2).flatten(0, 1).flatten(-2)[real], self.out.weight, self.out.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, real: torch.Tensor, shape: tuple[int, int],
                ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        pre = self.config.pre_norm
        x = _sublayer(x, self.attn_norm, lambda h: self.attend(h, mask, real, shape, ops), pre)
        return _sublayer(x, self.mlp_norm, lambda h: self.mlp(h, ops), pre)


class DecoderLayer(Layer):
    def __init__(self, config: Seq2SeqConfig):
        super().__init__(config, config.decoder_ffn, bidirectional=False)
        d, inner, bias = config.d_model, config.inner_dim, config.linear_bias
        self.cross_norm = make_norm(config)
        self.cross_q = nn.Linear(d, inner, bias=bias)
        self.cross_kv = nn.Linear(d, 2 * inner, bias=bias)  # on the encoder's output, once per request (`encode`)
        self.cross_out = nn.Linear(inner, d, bias=bias)

    def self_attend(self, x, k_cache, v_cache, attention, ops: LayerOps) -> torch.Tensor:
        q, k, v = ops.linear(x, self.qkv.weight, self.qkv.bias).unflatten(-1, (3, self.config.n_heads, -1)).unbind(1)
        return ops.linear(attention.forward(q, k, v, k_cache, v_cache), self.out.weight, self.out.bias)

    def cross_attend(self, x, k_cache, v_cache, cross: CrossAttention, ops: LayerOps, align: bool) -> torch.Tensor:
        q = ops.linear(x, self.cross_q.weight, self.cross_q.bias).unflatten(-1, (self.config.n_heads, -1))
        return ops.linear(cross.forward(q, k_cache, v_cache, align), self.cross_out.weight, self.cross_out.bias)

    def step(self, x, self_kv, cross_kv, attention, cross: CrossAttention, ops: LayerOps,
             align: bool = False) -> torch.Tensor:
        pre = self.config.pre_norm
        x = _sublayer(x, self.attn_norm, lambda h: self.self_attend(h, *self_kv, attention, ops), pre)
        x = _sublayer(x, self.cross_norm, lambda h: self.cross_attend(h, *cross_kv, cross, ops, align), pre)
        return _sublayer(x, self.mlp_norm, lambda h: self.mlp(h, ops), pre)


def _encoder_mask(table: RelativeBias | None, positions: torch.Tensor, keys: torch.Tensor,
                  dtype: torch.dtype) -> torch.Tensor:
    """keys (E, 1, 1, S): which keys are real; with a bias table (T5), its bias (1, H, S, S) with -inf on the padding
    keys, for SDPA to add to the scores."""
    if table is None:
        return keys
    return table(positions, positions)[None].masked_fill(~keys, float("-inf")).to(dtype)


class Seq2SeqTransformer(nn.Module):
    state_kind = EncoderDecoderState.kind
    is_encoder_decoder = True
    aligns = True  # its alignment (StepBatch.alignment): the last layer's cross-attention, averaged over heads

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)  # the decoder's, and the encoder's where they share one
        self.src_embed = nn.Embedding(config.source_vocab_size, d) if config.source_vocab_size else None
        self.encoder = Stack(config, [EncoderLayer(config) for _ in range(config.encoder_layers)],
                             config.max_source_len, bidirectional=True)
        self.decoder = Stack(config, [DecoderLayer(config) for _ in range(config.decoder_layers)], config.max_seq_len,
                             bidirectional=False)
        self.lm_head = None if config.tie_output else nn.Linear(d, config.vocab_size, bias=False)
        self.lm_bias = nn.Parameter(torch.zeros(1, config.vocab_size)) if config.output_bias else None
        self.attention_backend = "auto"  # resolved by new_state, as a decoder-only Transformer's
        self.layer_ops: LayerOps = TORCH_OPS

    @property
    def source_embed(self) -> nn.Embedding:
        return self.src_embed if self.src_embed is not None else self.embed

    def new_state(self, num_blocks: int, block_size: int = 16, num_encoder_blocks: int = 1,
                  dtype: torch.dtype | None = None, attention_backend: str | None = None) -> EncoderDecoderState:
        c = self.config
        like = self.embed.weight
        dtype = dtype or like.dtype
        backend = select_attention_backend(attention_backend or self.attention_backend, like.device)
        kv = PagedKVCache(c.decoder_layers, num_blocks, block_size, c.n_heads, c.head_dim, dtype, like.device,
                          attention=backend)
        encoder = EncoderCache(c.decoder_layers, num_encoder_blocks, block_size, c.n_heads, c.head_dim, dtype,
                               like.device)
        return EncoderDecoderState(kv, encoder)

    def run_encoder(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens (E, S) right-padded sources, lengths (E,) -> the encoder's output for their real tokens, packed
        source after source (N, D)."""
        ops = self.layer_ops
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        valid = positions[None, :] < lengths[:, None]  # (E, S)
        real = valid.flatten().nonzero().squeeze(1)
        x = self.encoder.embed(self.source_embed(tokens), positions).flatten(0, 1)[real]
        keys = valid[:, None, None, :]
        mask = _encoder_mask(self.encoder.rel_bias, positions, keys, x.dtype)  # T5: one for every layer
        for layer in self.encoder.layers:
            own = mask if layer.rel_bias is None else _encoder_mask(layer.rel_bias, positions, keys, x.dtype)  # umT5
            x = layer(x, own, real, tuple(tokens.shape), ops)
        return self.encoder.final_norm(x) if self.encoder.final_norm is not None else x

    @torch.inference_mode()
    def encode(self, sources: list[list[int]], tables: list[list[int]], state: EncoderDecoderState) -> None:
        """Run the encoder over `sources` (many requests' token ids, in one pass) and write every
        decoder layer's cross-attention K,V of source i into its blocks `tables[i]` of the state's encoder cache."""
        cache = state.encoder
        device, size = cache.k.device, cache.block_size
        longest = max(len(s) for s in sources)
        tokens = to_device([s + [0] * (longest - len(s)) for s in sources], device, torch.long)
        lengths = to_device([len(s) for s in sources], device, torch.long)
        memory = self.run_encoder(tokens, lengths)  # (real tokens, D)
        slots = to_device([table[t // size] * size + t % size for s, table in zip(sources, tables)
                           for t in range(len(s))], device, torch.long)
        heads = self.config.n_heads
        for i, layer in enumerate(self.decoder.layers):
            k, v = self.layer_ops.linear(memory, layer.cross_kv.weight, layer.cross_kv.bias).unflatten(
                -1, (2, heads, -1)).unbind(1)
            cache.k[i].view(-1, heads, k.shape[-1])[slots] = k.to(cache.k.dtype)
            cache.v[i].view(-1, heads, v.shape[-1])[slots] = v.to(cache.v.dtype)

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: EncoderDecoderState) -> torch.Tensor:
        """Run each sequence's new decoder tokens against its cached self-attention K,V (written in place) and its
        request's encoder output."""
        kv, memory, ops, c = state.kv, state.encoder, self.layer_ops, self.config
        if c.relative_buckets:  # T5: the stack's table for every layer; umT5: the first layer's, then each its own
            table = self.decoder.rel_bias if self.decoder.rel_bias is not None else self.decoder.layers[0].rel_bias
            attention = RelativeBiasAttention(batch, kv.block_size, table, c.scale, kv.k.dtype)
        else:
            attention = kv.attention.build(batch, kv.block_size)
        cross = CrossAttention.build(batch, memory.block_size, c.scale, kv.attention.name, memory.k.dtype)
        x = self.decoder.embed(self.embed(batch.token_ids), batch.positions)
        last = len(self.decoder.layers) - 1
        for i, layer in enumerate(self.decoder.layers):
            align = batch.want_alignment and i == last
            # umT5: each layer's own table (the first layer's is the one `attention` was built with)
            own = attention.with_bias(layer.rel_bias) if layer.rel_bias is not None and i else attention
            x = layer.step(x, (kv.k[i], kv.v[i]), (memory.k[i], memory.v[i]), own, cross, ops, align)
        if batch.want_alignment:
            batch.sum_alignment(cross.mean_alignment())
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]
        if self.decoder.final_norm is not None:
            x = self.decoder.final_norm(x)
        if c.output_scale != 1.0:
            x = x * c.output_scale
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return ops.linear(x, weight, None if self.lm_bias is None else self.lm_bias[0]).float()  # bias in the GEMM
