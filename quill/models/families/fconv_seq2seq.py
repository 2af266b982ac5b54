"""fairseq's convolutional translation model (`fconv`, `fconv_wmt_en_de`, `fconv_wmt_en_fr`, `fconv_wmt_en_ro`,
`fconv_iwslt_de_en`; Gehring et al. 2017, "Convolutional Sequence to Sequence Learning").

Both stacks are the gated convolutions of fairseq's language model (fconv.py), with learned positions
(position p reads row pad + 1 + p, as fairseq's make_positions numbers a sequence's real tokens):

    encoder: e = embed(src) + pos -> fc1 -> for each (out_channels, kernel_size, residual):
                 x = (GLU(conv(x)) + proj(earlier output)) * sqrt(0.5)   # centred: (k-1)//2 before, k//2 after
             -> fc2: z;  keys z, values (z + e) * sqrt(0.5)
    decoder: g = embed(tgt) + pos -> fc1 -> for each layer:
                 y = GLU(causal_conv(x))
                 where it attends: a = softmax((in_proj(y) + g) * sqrt(0.5) . z) (values) * sqrt(s)
                                   y = (out_proj(a) + y) * sqrt(0.5)        # s: the source's real length
                 x = (y + proj(earlier output)) * sqrt(0.5)
             -> fc2 -> fc3 (logits; fc3's weight the target embedding where share_input_output_embed)

The attention has one head, no score scale, and the same keys and values for every layer that attends.

State: `encode` runs the encoder once per request (many sources padded into one pass; each source's padding is
zeroed before every convolution, as fairseq does, so a source's output is what it is alone) and writes z and
(z + e) * sqrt(0.5) into the blocks of a one-layer, one-head `EncoderCache`, which every sequence of the request
reads (quill/models/attention/cross.py). The decoder's own state is, as the language model's, only each causal
convolution's window of its last k-1 inputs, in one flat row per slot; all zeros is an empty sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.cross import CrossAttention
from ..batch import StepBatch, run_by_parts, split_decodes
from ..host_copy import to_device
from ..kernels import TORCH_OPS, LayerOps
from ..state import EncoderCache, EncoderDecoderState, SlotState
from .fconv import CausalGatedConv

SQRT_HALF = math.sqrt(0.5)  # fairseq's scale of every sum of two paths


@dataclass
class FConvSeq2SeqConfig:
    vocab_size: int  # the decoder's (target) vocabulary
    source_vocab_size: int | None = None  # the encoder's; None: vocab_size
    encoder_embed_dim: int = 512
    decoder_embed_dim: int = 512  # the attention's width too: equal to encoder_embed_dim where any layer attends
    # (out_channels, kernel_size, residual) per convolution, as in fconv.py; fairseq's `fconv`: [(512, 3)] * 20
    encoder_layers: list[list[int]] = field(default_factory=lambda: [[512, 3, 1]] * 20)
    decoder_layers: list[list[int]] = field(default_factory=lambda: [[512, 3, 1]] * 20)
    decoder_attention: list[bool] | bool = True  # per decoder layer, or one for all
    out_embed_dim: int = 256  # fc2's width
    share_input_output_embed: bool = False  # fc3's weight is the target embedding (out_embed_dim = decoder's)
    max_source_len: int = 1022  # positions of the encoder's table (fairseq's 1024 rows less pad + 1)
    max_seq_len: int = 1022  # of the decoder's
    decoder_start_token_id: int = 2  # fairseq starts every target with </s>
    pad_token_id: int = 1  # fairseq's dictionaries: <s> 0, <pad> 1, </s> 2, <unk> 3
    forced_bos_token_id: int | None = None
    extra: dict = field(default_factory=dict)  # provenance (the fairseq architecture it came from)

    def __post_init__(self):
        for name in ("encoder_layers", "decoder_layers"):
            layers = [list(layer) for layer in getattr(self, name)]
            setattr(self, name, layers)
            if not layers:
                raise ValueError(f"{name}: an fconv stack needs at least one convolution")
            for i, layer in enumerate(layers):
                if len(layer) != 3 or not all(type(n) is int for n in layer):
                    raise ValueError(f"{name}[{i}] must be (out_channels, kernel_size, residual), not {layer}")
                if layer[0] < 1 or layer[1] < 1 or not 0 <= layer[2] <= i + 1:
                    raise ValueError(f"{name}[{i}] {tuple(layer)}: widths and kernels must be at least 1 and the "
                                     f"residual between 0 and {i + 1}")
        if isinstance(self.decoder_attention, bool):
            self.decoder_attention = [self.decoder_attention] * len(self.decoder_layers)
        self.decoder_attention = list(self.decoder_attention)
        if len(self.decoder_attention) != len(self.decoder_layers) or not all(
                isinstance(a, bool) for a in self.decoder_attention):
            raise ValueError(f"decoder_attention {self.decoder_attention}: one boolean per decoder layer "
                             f"({len(self.decoder_layers)})")
        if any(self.decoder_attention) and self.encoder_embed_dim != self.decoder_embed_dim:
            raise ValueError(f"encoder_embed_dim {self.encoder_embed_dim} and decoder_embed_dim "
                             f"{self.decoder_embed_dim} differ: the attention needs them equal")
        if self.share_input_output_embed and self.out_embed_dim != self.decoder_embed_dim:
            raise ValueError(f"share_input_output_embed needs out_embed_dim ({self.out_embed_dim}) equal to "
                             f"decoder_embed_dim ({self.decoder_embed_dim})")

    @property
    def position_offset(self) -> int:
        """Position p reads row p + this of the position tables (fairseq: its first real token gets pad + 1)."""
        return self.pad_token_id + 1

    @property
    def window_sizes(self) -> list[int]:
        """Floats of decoder state per slot for each convolution: its last k-1 inputs."""
        return [(k - 1) * c for (_, k, _), c in zip(self.decoder_layers, in_channels(self.decoder_layers))]


def in_channels(layers: list[list[int]]) -> list[int]:
    """Each convolution's input width: fc1's output, then the previous convolution's."""
    return [layers[0][0]] + [out for out, _, _ in layers[:-1]]


def _residual(x: torch.Tensor, residual: int, outputs: list[torch.Tensor], proj: nn.Module | None) -> torch.Tensor:
    """x with the output `residual` layers back added (projected where widths differ), or x alone for 0."""
    if not residual:
        return x
    skip = outputs[-residual]
    return (x + (skip if proj is None else proj(skip))) * SQRT_HALF


class ConvStack(nn.Module):
    """What both stacks have: token and position embeddings, fc1 to the first width, the gated convolutions and
    the projections of residuals whose width differs from their layer's."""

    def __init__(self, vocab_size: int, embed_dim: int, max_len: int, layers: list[list[int]], offset: int):
        super().__init__()
        self.layers = layers
        self.offset = offset
        self.embed_tokens = nn.Embedding(vocab_size, embed_dim)
        self.embed_positions = nn.Embedding(max_len + offset, embed_dim)
        self.fc1 = nn.Linear(embed_dim, layers[0][0])
        widths = [layers[0][0]]  # fc1's output width, then each layer's: what residuals reach back to
        self.projections = nn.ModuleList()
        self.convolutions = nn.ModuleList()
        for (out_channels, kernel_size, residual), width in zip(layers, in_channels(layers)):
            source = widths[-residual] if residual else out_channels
            self.projections.append(nn.Linear(source, out_channels) if source != out_channels else None)
            self.convolutions.append(CausalGatedConv(width, out_channels, kernel_size))
            widths.append(out_channels)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens) + self.embed_positions(positions + self.offset)


class FConvEncoder(ConvStack):
    def __init__(self, c: FConvSeq2SeqConfig):
        super().__init__(c.source_vocab_size or c.vocab_size, c.encoder_embed_dim, c.max_source_len, c.encoder_layers,
                         c.position_offset)
        self.fc2 = nn.Linear(c.encoder_layers[-1][0], c.encoder_embed_dim)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (E, S) right-padded sources, lengths (E,) -> the attention's keys and values of their real
        tokens, packed source after source, each (N, embed_dim)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        valid = positions[None, :] < lengths[:, None]  # (E, S)
        padding = ~valid[..., None]
        embedded = self.embed(tokens, positions)  # (E, S, D)
        x = self.fc1(embedded)
        outputs = [x]
        for (_, k, residual), proj, conv in zip(self.layers, self.projections, self.convolutions):
            # zeros beyond the source's end, in the batch's padding as past the longest source
            y = F.pad(x.masked_fill(padding, 0.0), (0, 0, (k - 1) // 2, k // 2))  # (E, S+k-1, in)
            # each position's k inputs through one matrix product, as the decoder's steps run (on the CPU conv1d
            # takes a slow path for these shapes, 1x1 ones most of all)
            windows = y.unfold(1, k, 1).flatten(2)  # (E, S, in*k), the weight's order
            y = F.glu(F.linear(windows, conv.weight.flatten(1), conv.bias), dim=-1)  # (E, S, out)
            x = _residual(y, residual, outputs, proj)
            outputs.append(x)
        keys = self.fc2(x[valid])
        return keys, (keys + embedded[valid]) * SQRT_HALF


class AttentionLayer(nn.Module):
    """A decoder layer's attention over the source: its query is the convolution's output projected to the
    embedding width plus the target embedding; its output is projected back and added to that output."""

    def __init__(self, conv_channels: int, embed_dim: int):
        super().__init__()
        self.in_projection = nn.Linear(conv_channels, embed_dim)
        self.out_projection = nn.Linear(embed_dim, conv_channels)

    def forward(self, x: torch.Tensor, target_embedding: torch.Tensor, cross: CrossAttention,
                k_cache: torch.Tensor, v_cache: torch.Tensor, length_scale: torch.Tensor,
                align: bool = False) -> torch.Tensor:
        """x (T, C) packed decoder rows, target_embedding (T, D), length_scale (T, 1): sqrt(source length)."""
        q = (self.in_projection(x) + target_embedding) * SQRT_HALF
        context = cross.forward(q[:, None, :].to(k_cache.dtype), k_cache, v_cache, align).to(x.dtype)  # (T, D)
        return (self.out_projection(context * length_scale) + x) * SQRT_HALF


class FConvDecoder(ConvStack):
    def __init__(self, c: FConvSeq2SeqConfig):
        super().__init__(c.vocab_size, c.decoder_embed_dim, c.max_seq_len, c.decoder_layers, c.position_offset)
        self.attention = nn.ModuleList(AttentionLayer(out_channels, c.decoder_embed_dim) if attends else None
                                       for (out_channels, _, _), attends in zip(c.decoder_layers, c.decoder_attention))
        self.fc2 = nn.Linear(c.decoder_layers[-1][0], c.out_embed_dim)
        if c.share_input_output_embed:  # fc3's weight is embed_tokens'; only its bias is its own
            self.fc3 = None
            self.output_bias = nn.Parameter(torch.zeros(c.vocab_size))
        else:
            self.fc3 = nn.Linear(c.out_embed_dim, c.vocab_size)
            self.output_bias = None

    def logits(self, h: torch.Tensor, ops: LayerOps = TORCH_OPS) -> torch.Tensor:
        """(N, last width) -> (N, V) float32."""
        h = self.fc2(h)
        if self.fc3 is None:
            return ops.linear(h, self.embed_tokens.weight, self.output_bias).float()
        return self.fc3(h).float()


class FConvSeq2Seq(nn.Module):
    state_kind = EncoderDecoderState.kind
    is_encoder_decoder = True
    layer_ops: LayerOps = TORCH_OPS  # the loader's choice: how a step's products run (oneDNN on the CPU)
    encoder_state_rows = 0  # an encoder entry is one row per source token

    def __init__(self, config: FConvSeq2SeqConfig):
        super().__init__()
        self.config = config
        self.encoder = FConvEncoder(config)
        self.decoder = FConvDecoder(config)
        # resolved by the loader ("cpu": the CPU kernel reads the encoder blocks in place; else gathered for SDPA)
        self.attention_backend = "auto"

    @property
    def aligns(self) -> bool:
        """Its alignment (StepBatch.alignment) is fairseq's: the attention layers' weights, averaged."""
        return any(self.config.decoder_attention)

    def new_state(self, num_slots: int, block_size: int = 16, num_encoder_blocks: int = 1,
                  dtype: torch.dtype | None = None) -> EncoderDecoderState:
        """Encoder blocks of keys and values (one layer, one head of embed_dim) and a row of windows per slot."""
        c = self.config
        like = self.decoder.embed_tokens.weight
        dtype = dtype or like.dtype
        encoder = EncoderCache(1, num_encoder_blocks, block_size, 1, c.encoder_embed_dim, dtype, like.device)
        windows = torch.zeros(num_slots, sum(c.window_sizes), dtype=dtype, device=like.device)
        return EncoderDecoderState(None, encoder, slots=SlotState({"windows": windows}))

    @torch.inference_mode()
    def encode(self, sources: list[list[int]], tables: list[list[int]], state: EncoderDecoderState) -> None:
        """Run the encoder over `sources` (many requests' token ids, in one pass) and write source i's keys and
        values into its blocks `tables[i]` of the state's encoder cache."""
        cache = state.encoder
        device, size, pad = cache.k.device, cache.block_size, self.config.pad_token_id
        longest = max(len(s) for s in sources)
        tokens = to_device([s + [pad] * (longest - len(s)) for s in sources], device, torch.long)
        lengths = to_device([len(s) for s in sources], device, torch.long)
        keys, values = self.encoder(tokens, lengths)  # (real tokens, D)
        slots = to_device([table[t // size] * size + t % size for s, table in zip(sources, tables)
                           for t in range(len(s))], device, torch.long)
        cache.k[0].view(-1, keys.shape[-1])[slots] = keys.to(cache.k.dtype)
        cache.v[0].view(-1, values.shape[-1])[slots] = values.to(cache.v.dtype)

    def _windows(self, flat: torch.Tensor) -> list[torch.Tensor | None]:
        """(slots, sum of window sizes) -> each convolution's (slots, k-1, in) view, None for k = 1."""
        layers = self.config.decoder_layers
        views = flat.split(self.config.window_sizes, dim=1)
        return [v.view(flat.shape[0], k - 1, c) if k > 1 else None
                for v, (_, k, _), c in zip(views, layers, in_channels(layers))]

    def _convolve(self, conv: CausalGatedConv, window: torch.Tensor | None, part: StepBatch,
                  x: torch.Tensor) -> torch.Tensor:
        """A part's packed inputs (N, in) after its slots' windows -> (N, out); the windows slid on in place."""
        new = part.pad(x)  # right-padded: pads only follow real positions
        if window is None:
            return part.unpad(conv(new, None, self.layer_ops)[0])
        out, inputs = conv(new, window[part.slots].to(new.dtype), self.layer_ops)
        window[part.slots] = part.last_inputs(inputs, conv.kernel_size - 1).to(window.dtype)
        return part.unpad(out)

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: EncoderDecoderState) -> torch.Tensor:
        """Run each sequence's new target tokens after its windows (stored back in place), attending to its
        request's encoder output. The convolutions run decode rows apart from longer chunks (split_decodes), so
        that they are not padded to a chunk's length; everything else runs on the packed rows."""
        d, memory = self.decoder, state.encoder
        windows = self._windows(state.slots["windows"])
        parts = split_decodes(batch)
        cross = CrossAttention.build(batch, memory.block_size, 1.0, self.attention_backend, memory.k.dtype)
        target_embedding = d.embed(batch.token_ids, batch.positions)  # (T, D)
        # fairseq scales the attention's output by s * sqrt(1/s), s the source's real length
        length_scale = cross.lens[:, None].float().sqrt().to(target_embedding.dtype)  # (T, 1)
        x = d.fc1(target_embedding)
        outputs = [x]
        for (_, _, residual), proj, conv, attention, window in zip(d.layers, d.projections, d.convolutions,
                                                                   d.attention, windows):
            y = run_by_parts(parts, partial(self._convolve, conv, window), x)
            if attention is not None:
                y = attention(y, target_embedding, cross, memory.k[0], memory.v[0], length_scale,
                              batch.want_alignment)
            x = _residual(y, residual, outputs, proj)
            outputs.append(x)
        if batch.want_alignment:
            batch.sum_alignment(cross.mean_alignment())
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]
        return d.logits(x, self.layer_ops)
