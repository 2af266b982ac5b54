"""OpenNMT-py's recurrent encoder-decoder: an LSTM or GRU encoder and a decoder with global attention (Luong et
al. 2015, "dot" and "general"; Bahdanau et al. 2015, "mlp") and input feeding, as models/classic/opennmt.py reads it.

Encoder: source embeddings -> `layers` LSTM or GRU layers over the source, bidirectional for OpenNMT's "brnn"
(each direction hidden_size / 2 wide, outputs concatenated). Its outputs are the memory bank h_1..h_S (S, H); its
last states, each layer's two directions concatenated, start the decoder (OpenNMT's optional bridge first maps
them: relu(W s + b) over each example's states flattened in (layer, direction) order, cut into rows of
layers * H / directions).

Decoder, for target token y_t (t = 1, 2, ...), o_0 = 0:
    x_t = [emb(y_t); o_{t-1}] with input feeding, emb(y_t) without
    s_t = RNN(x_t, s_{t-1})                    stacked cells; h_t, the top layer's output, is the query
    a_tj = softmax_j score(h_t, h_j)           over the real source tokens:
        dot: h_t . h_j    general: (W_a h_t) . h_j = h_t . (W_a^T h_j)    mlp: v . tanh(W_q h_t + b_q + U h_j)
    c_t = sum_j a_tj h_j
    o_t = tanh(W_c [c_t; h_t]) for dot and general (no bias), W_c [c_t; h_t] + b_c for mlp; h_t without attention
    log p(y_{t+1}) = log_softmax(W_g o_t + b_g)      W_g: the target embeddings with share_decoder_embeddings

State: the encoder runs once per request (`encode`, many sources in one pass) and writes into the blocks of an
`EncoderCache` of one layer and one head H wide: for each source token j, k = its attention key (h_j for dot,
W_a^T h_j for general, U h_j for mlp: whatever of the score depends on the source alone) and v = h_j; then
`encoder_state_rows` rows, one per decoder layer, holding the decoder's initial h in k and c in v. Each sequence
holds a slot: every decoder layer's h (and c) and the input feed o_{t-1}; its first step (position 0) starts from
its request's rows, so every beam of a request reads the same encoder output and forks copy only the slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..batch import StepBatch
from ..kernels import TORCH_OPS, LayerOps
from ..host_copy import to_device
from ..state import EncoderCache, EncoderDecoderState, SlotState
from .lstm import run_recurrent

RNN_TYPES = ("LSTM", "GRU")
ATTENTIONS = ("dot", "general", "mlp", "none")


@dataclass
class RNNSeq2SeqConfig:
    vocab_size: int  # the decoder's (target) vocabulary
    source_vocab_size: int
    hidden_size: int = 500  # the decoder's, and both encoder directions' together
    layers: int = 2  # in the encoder and in the decoder (the decoder starts from every encoder layer's state)
    source_embed_dim: int = 500
    target_embed_dim: int = 500
    rnn_type: str = "LSTM"
    bidirectional: bool = False  # OpenNMT's "brnn" encoder
    bridge: bool = False  # a linear layer and relu on the encoder's last states
    global_attention: str = "general"  # one of ATTENTIONS
    global_attention_function: str = "softmax"
    input_feed: bool = True  # the previous attentional output joins each decoder input
    share_decoder_embeddings: bool = False  # the generator's weight is the target embeddings
    source_features: int = 0  # word features beside each source token (OpenNMT's src_feats): refused
    position_encoding: bool = False  # sinusoids added to the embeddings: refused
    max_source_len: int = 1024  # any bound: a recurrent encoder has no positions
    max_seq_len: int = 1024
    decoder_start_token_id: int = 2  # OpenNMT's <s>
    pad_token_id: int | None = 1
    forced_bos_token_id: int | None = None
    extra: dict = field(default_factory=dict)  # provenance (OpenNMT-py's version and options)

    def __post_init__(self):
        if self.rnn_type not in RNN_TYPES:
            raise ValueError(f"rnn_type must be one of {RNN_TYPES}, not {self.rnn_type!r}")
        if self.global_attention not in ATTENTIONS:
            raise ValueError(f"global_attention must be one of {ATTENTIONS}, not {self.global_attention!r}")
        if self.global_attention_function != "softmax":
            raise ValueError(f"global_attention_function {self.global_attention_function!r}: Quill computes "
                             "attention with softmax only")
        if self.source_features:
            raise ValueError(f"{self.source_features} source word features: Quill embeds words only")
        if self.position_encoding:
            raise ValueError("position_encoding: Quill's recurrent encoder-decoder embeds words only, without "
                             "sinusoidal positions")
        if self.layers < 1 or self.hidden_size < 1:
            raise ValueError(f"layers ({self.layers}) and hidden_size ({self.hidden_size}) must be positive")
        if self.bidirectional and self.hidden_size % 2:
            raise ValueError(f"a bidirectional encoder splits hidden_size ({self.hidden_size}) in two: it must be even")
        if self.share_decoder_embeddings and self.target_embed_dim != self.hidden_size:
            raise ValueError(f"share_decoder_embeddings needs target_embed_dim ({self.target_embed_dim}) to equal "
                             f"hidden_size ({self.hidden_size})")

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1


def _rnn(rnn_type: str, d_in: int, hidden: int, layers: int, bidirectional: bool = False) -> nn.Module:
    return getattr(nn, rnn_type)(d_in, hidden, layers, batch_first=True, bidirectional=bidirectional)


class GlobalAttention(nn.Module):
    """Luong's and Bahdanau's attention over the memory bank, the source's side precomputed as keys."""

    def __init__(self, dim: int, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "general":
            self.linear_in = nn.Linear(dim, dim, bias=False)  # W_a
        if kind == "mlp":
            self.linear_context = nn.Linear(dim, dim, bias=False)  # U
            self.linear_query = nn.Linear(dim, dim)  # W_q, b_q
            self.v = nn.Linear(dim, 1, bias=False)
        self.linear_out = nn.Linear(2 * dim, dim, bias=kind == "mlp")  # W_c over [c; h]

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """(N, H) memory-bank rows -> (N, H) the score's source side."""
        if self.kind == "general":
            return TORCH_OPS.linear(memory, self.linear_in.weight.t(), None)  # a narrowed weight widened
        if self.kind == "mlp":
            return self.linear_context(memory)
        return memory

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Q, H); keys, values (B, S, H); mask (B, 1, S) the real source rows -> the outputs (B, Q, H)
        and the attention weights (B, Q, S)."""
        if self.kind == "mlp":
            scores = self.v(torch.tanh(self.linear_query(query)[:, :, None] + keys[:, None])).squeeze(-1)
        else:
            scores = query @ keys.transpose(1, 2)  # (B, Q, S)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        out = self.linear_out(torch.cat([weights @ values, query], dim=-1))
        return (out if self.kind == "mlp" else torch.tanh(out)), weights


class RNNSeq2Seq(nn.Module):
    state_kind = EncoderDecoderState.kind
    is_encoder_decoder = True
    # its attention trims the blocks it reads to the step's longest source, a size read on the host: no CUDA graphs
    captures_decode_graphs = False
    layer_ops: LayerOps = TORCH_OPS  # the loader's choice: how the generator multiplies (oneDNN on the CPU)

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__()
        self.config = c = config
        hidden, dirs = c.hidden_size, c.directions
        self.src_embed = nn.Embedding(c.source_vocab_size, c.source_embed_dim)
        self.tgt_embed = nn.Embedding(c.vocab_size, c.target_embed_dim)
        self.encoder = _rnn(c.rnn_type, c.source_embed_dim, hidden // dirs, c.layers, c.bidirectional)
        width = hidden // dirs * c.layers
        self.bridge = nn.ModuleList(nn.Linear(width, width) for _ in self.state_names) if c.bridge else None
        if c.input_feed:  # a cell per layer: each token's input needs the previous token's output
            cell = nn.LSTMCell if c.rnn_type == "LSTM" else nn.GRUCell
            self.decoder = nn.ModuleList(cell(c.target_embed_dim + hidden if i == 0 else hidden, hidden)
                                         for i in range(c.layers))
        else:
            self.decoder = _rnn(c.rnn_type, c.target_embed_dim, hidden, c.layers)
        self.attn = None if c.global_attention == "none" else GlobalAttention(hidden, c.global_attention)
        self.generator = None if c.share_decoder_embeddings else nn.Linear(hidden, c.vocab_size, bias=False)
        self.generator_bias = nn.Parameter(torch.zeros(c.vocab_size))

    @property
    def aligns(self) -> bool:
        """Its alignment (StepBatch.alignment) is OpenNMT's: the global attention's weights."""
        return self.attn is not None

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("h", "c") if self.config.rnn_type == "LSTM" else ("h",)

    @property
    def encoder_state_rows(self) -> int:
        """Rows each encoder entry holds after its source's: the decoder's initial state, a row per layer."""
        return self.config.layers

    def new_state(self, num_slots: int, block_size: int = 16, num_encoder_blocks: int = 1,
                  dtype: torch.dtype | None = None) -> EncoderDecoderState:
        """Encoder blocks of (block_size, 1 head, hidden_size) keys and values; per slot, (layers, hidden_size)
        for each of h (and c), and (hidden_size,) of input feed."""
        c = self.config
        like = self.tgt_embed.weight
        dtype = dtype or like.dtype
        encoder = EncoderCache(1, num_encoder_blocks, block_size, 1, c.hidden_size, dtype, like.device)
        shapes = {name: (num_slots, c.layers, c.hidden_size) for name in self.state_names}
        if c.input_feed:
            shapes["feed"] = (num_slots, c.hidden_size)
        slots = SlotState({name: torch.zeros(shape, dtype=dtype, device=like.device) for name, shape in shapes.items()})
        return EncoderDecoderState(None, encoder, slots=slots)

    def _bridge(self, linear: nn.Linear, states: torch.Tensor) -> torch.Tensor:
        """(layers * directions, E, H / directions) -> the same, through the bridge (OpenNMT's reshapes)."""
        per_example = states.transpose(0, 1)  # (E, layers * directions, H / directions)
        mapped = F.relu(linear(per_example.reshape(-1, linear.in_features)))
        return mapped.view(per_example.shape).transpose(0, 1)

    def run_encoder(self, tokens: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """tokens (E, S) right-padded sources -> the memory bank of their real tokens, packed source after source
        (N, H), and the decoder's initial state, (layers, E, H) for each of h (and c)."""
        packed = pack_padded_sequence(self.src_embed(tokens), torch.tensor(lengths), batch_first=True,
                                      enforce_sorted=False)
        out, final = self.encoder(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])  # (E, S, H)
        final = final if isinstance(final, tuple) else (final,)  # (layers * directions, E, H / directions)
        if self.bridge is not None:
            final = tuple(self._bridge(linear, states) for linear, states in zip(self.bridge, final))
        if self.config.bidirectional:  # layer l's forward and backward states side by side
            final = tuple(torch.cat([states[0::2], states[1::2]], dim=-1) for states in final)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        real = (positions[None, :] < to_device(lengths, tokens.device, torch.long)[:, None]).flatten()
        return out.flatten(0, 1)[real], final

    @torch.inference_mode()
    def encode(self, sources: list[list[int]], tables: list[list[int]], state: EncoderDecoderState) -> None:
        """Run the encoder over `sources` (many requests' token ids, in one pass) and write source i's keys and
        memory bank, then its decoder's initial state, into its blocks `tables[i]` of the state's encoder cache."""
        if any(not source for source in sources):
            raise ValueError("an empty source: a recurrent encoder needs at least one token")
        cache, c = state.encoder, self.config
        device, size, rows = cache.k.device, cache.block_size, self.encoder_state_rows
        lengths = [len(s) for s in sources]
        longest = max(lengths)
        tokens = to_device([s + [0] * (longest - len(s)) for s in sources], device, torch.long)
        memory, final = self.run_encoder(tokens, lengths)
        source_slots = to_device([table[t // size] * size + t % size for n, table in zip(lengths, tables)
                                  for t in range(n)], device, torch.long)
        state_slots = to_device([table[t // size] * size + t % size for n, table in zip(lengths, tables)
                                 for t in range(n, n + rows)], device, torch.long)
        k, v = cache.k[0].view(-1, c.hidden_size), cache.v[0].view(-1, c.hidden_size)
        keys = memory if self.attn is None else self.attn.keys(memory)
        k[source_slots], v[source_slots] = keys.to(k.dtype), memory.to(v.dtype)
        for rows_of, states in zip((k, v), final):  # h in k, c in v: (E * layers, H), source-major
            rows_of[state_slots] = states.transpose(0, 1).flatten(0, 1).to(rows_of.dtype)

    def _start(self, batch: StepBatch, state: EncoderDecoderState) -> dict[str, torch.Tensor]:
        """Each sequence's slot, (B, ...) per name, with a sequence at position 0 starting from its request's
        encoder rows (and no input feed). Chosen on the device: no copy to the host, as a captured step needs."""
        c, cache, size = self.config, state.encoder, state.encoder.block_size
        rows = {name: state.slots[name][batch.slots] for name in state.slots.tensors}
        first = batch.positions[batch.seq_starts] == 0  # (B,)
        t = batch.cross_lens[:, None] + torch.arange(c.layers, device=first.device)  # (B, layers)
        where = batch.cross_tables.gather(1, t // size) * size + t % size
        for name, cached in zip(self.state_names, (cache.k, cache.v)):
            rows[name] = torch.where(first[:, None, None], cached[0].view(-1, c.hidden_size)[where], rows[name])
        if c.input_feed:
            rows["feed"] = rows["feed"].masked_fill(first[:, None], 0)
        return rows

    def _memory(self, batch: StepBatch, cache: EncoderCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each sequence's keys and memory bank (B, W * block_size, H), and which rows are its source's (B, 1, S).
        Only the blocks the step's longest source fills are gathered, not the table's width (the longest source the
        model takes): attention over a few dozen rows, not a thousand masked ones."""
        width = -(-int(batch.cross_lens.max()) // cache.block_size)
        tables = batch.cross_tables[:, :width]
        keys = cache.k[0][tables].flatten(1, 3)  # (B, W, block_size, 1, H) -> (B, S, H)
        values = cache.v[0][tables].flatten(1, 3)
        rows = torch.arange(keys.shape[1], device=keys.device)
        return keys, values, (rows[None, :] < batch.cross_lens[:, None])[:, None, :]

    def _attend(self, query: torch.Tensor, memory) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, Q, H) -> the attentional outputs (B, Q, H) and the attention weights (B, Q, S) (None without
        attention)."""
        if self.attn is None:
            return query, None
        keys, values, mask = memory
        return self.attn(query, keys.to(query.dtype), values.to(query.dtype), mask)

    def _run_fed(self, x: torch.Tensor, rows: dict, memory, lengths: torch.Tensor | None,
                 want_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Q, E): input feeding, token after token; a row past its sequence's length keeps its state.
        Updates `rows` (h, c, feed) in place of their entries; returns the outputs o (B, Q, H) and, with
        `want_weights`, the attention weights (B, Q, S) (None without attention)."""
        hidden = [rows[name] for name in self.state_names]  # (B, layers, H)
        feed, outs, weights = rows["feed"].to(x.dtype), [], []
        for t in range(x.shape[1]):
            inp, ends = torch.cat([x[:, t], feed], dim=-1), []
            for i, cell in enumerate(self.decoder):
                start = tuple(h[:, i].to(x.dtype) for h in hidden)
                end = cell(inp, start if len(start) == 2 else start[0])
                end = end if isinstance(end, tuple) else (end,)
                ends.append(end)
                inp = end[0]
            new = [torch.stack(parts, dim=1) for parts in zip(*ends)]
            out, attended = self._attend(inp[:, None], memory)
            out = out[:, 0]
            if want_weights and attended is not None:
                weights.append(attended)
            if lengths is not None:
                active = (t < lengths)[:, None]
                new = [torch.where(active[..., None], n, h.to(n.dtype)) for n, h in zip(new, hidden)]
                out = torch.where(active, out, feed)
            hidden, feed = new, out
            outs.append(out)
        rows.update(zip(self.state_names, hidden), feed=feed)
        return torch.stack(outs, dim=1), torch.cat(weights, dim=1) if weights else None

    def _run_plain(self, x: torch.Tensor, rows: dict, memory,
                   lengths: list[int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Q, E): no input feeding, so the recurrent layers run over every token at once (cuDNN on a GPU),
        and attention after them."""
        start = tuple(rows[name].transpose(0, 1).to(x.dtype).contiguous() for name in self.state_names)
        out, end = run_recurrent(self.decoder, x, start, lengths)
        rows.update(zip(self.state_names, (e.transpose(0, 1) for e in end)))
        return self._attend(out, memory)

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: EncoderDecoderState) -> torch.Tensor:
        """Run each sequence's new target tokens from its slot (updated in place) against its request's encoder
        output -> (rows scored, vocab) float32 log-probabilities of the next token."""
        rows = self._start(batch, state)
        memory = None if self.attn is None else self._memory(batch, state.encoder)
        x = batch.pad(self.tgt_embed(batch.token_ids))  # (B, Q, E)
        if self.config.input_feed:
            out, weights = self._run_fed(x, rows, memory, batch.lens if batch.is_padded else None,
                                         batch.want_alignment)
        else:
            out, weights = self._run_plain(x, rows, memory, batch.query_lens if batch.is_padded else None)
        for name, tensor in rows.items():
            state.slots[name][batch.slots] = tensor.to(state.slots[name].dtype)
        if batch.want_alignment:
            batch.sum_alignment(batch.unpad(weights))
        out = batch.unpad(out)  # (T, H)
        if batch.logits_indices is not None:
            out = out[batch.logits_indices]
        weight = self.tgt_embed.weight if self.generator is None else self.generator.weight
        return torch.log_softmax(self.layer_ops.linear(out, weight, self.generator_bias).float(), dim=-1)
