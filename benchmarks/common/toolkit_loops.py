"""The toolkit translation benchmark's peer: the model's own step loop, as fairseq's `generate` and OpenNMT-py's
`translate` run it, written plainly in PyTorch over the weights of Quill's modules (read by name, never through
Quill's `encode` or `step`), and the shapes it runs.

fairseq's fconv (Gehring et al. 2017): the encoder over right-padded sources, padding zeroed before every
convolution (its FConvEncoder); then one target token per step, each decoder convolution a linear map over a buffer
of its last k inputs (LinearizedConvolution's incremental state), each attention layer over the encoder's keys
and values with the padding masked and the context scaled by sqrt(source length), fc2, fc3, log-softmax.

OpenNMT-py's RNN encoder-decoder (Luong et al. 2015): nn.LSTM over the packed sources (brnn: the two directions'
last states side by side start the decoder); then one target token per step through the stacked LSTMCells with
input feeding, "general" attention (W_a applied to the query, as its GlobalAttention does) over the masked memory
bank, tanh(W_c [c; h]), the generator and log-softmax.

Both: greedy, the end token barred at every step (fairseq's --min-len, OpenNMT's -min_length), every row decoding
`new_tokens` tokens; float32, under torch.inference_mode.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from quill.models.families.fconv_seq2seq import FConvSeq2Seq, FConvSeq2SeqConfig
from quill.models.families.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig

from .seq2seq_runs import Offline

# fairseq's fconv_wmt_en_fr (fconv.py): both stacks, every decoder layer attends, decoder_out_embed_dim 512
WMT_EN_FR_LAYERS = [[512, 3, 1]] * 6 + [[768, 3, 1]] * 4 + [[1024, 3, 1]] * 3 + [[2048, 1, 1]] + [[4096, 1, 1]]
FAIRSEQ_EOS = 2  # fairseq's dictionaries: <s> 0, <pad> 1, </s> 2, <unk> 3
ONMT_SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]  # OpenNMT-py's vocabularies start so (target; source: 2)
ONMT_EOS = 3


def fconv_config(scale: int = 1, vocab: int = 40_000) -> FConvSeq2SeqConfig:
    """fconv_wmt_en_fr with 40,000-token vocabularies; `scale` > 1 divides every width and the vocabularies."""
    layers = [[max(out // scale, 4), k, r] for out, k, r in WMT_EN_FR_LAYERS]
    return FConvSeq2SeqConfig(vocab_size=vocab // scale, source_vocab_size=vocab // scale,
                              encoder_embed_dim=768 // scale, decoder_embed_dim=768 // scale, encoder_layers=layers,
                              decoder_layers=layers, decoder_attention=True, out_embed_dim=512 // scale,
                              extra={"architecture": "fconv_wmt_en_fr"})


def lstm_config(scale: int = 1, vocab: int = 50_000) -> RNNSeq2SeqConfig:
    """OpenNMT-py's rnn baseline: 2-layer brnn LSTM encoder, 2-layer LSTM decoder, hidden and word vectors 500,
    general attention, input feeding; 50,000 words plus its specials (source 2, target 4)."""
    return RNNSeq2SeqConfig(vocab_size=vocab // scale + 4, source_vocab_size=vocab // scale + 2,
                            hidden_size=500 // scale // 2 * 2, layers=2, source_embed_dim=500 // scale,
                            target_embed_dim=500 // scale, rnn_type="LSTM", bidirectional=True,
                            global_attention="general", input_feed=True, decoder_start_token_id=2, pad_token_id=1)


def random_model(config: FConvSeq2SeqConfig | RNNSeq2SeqConfig, seed: int = 0) -> FConvSeq2Seq | RNNSeq2Seq:
    """Matrices drawn with std 1/sqrt(fan-in), embeddings with std 1, biases zero: each token's embedding weighs
    as much as what the layers add, so greedy picks vary from step to step and source to source."""
    torch.manual_seed(seed)
    model = (FConvSeq2Seq if isinstance(config, FConvSeq2SeqConfig) else RNNSeq2Seq)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.zero_()
            else:
                p.normal_(std=1.0 if "embed" in name else p[0].numel() ** -0.5)
    return model.eval().requires_grad_(False)


def random_sources(count: int, lens: tuple[int, int], vocab: int, first_word: int, eos: int | None,
                   seed: int) -> list[list[int]]:
    """`count` sources of lens[0]..lens[1] ids (uniform, inclusive), words drawn from [first_word, vocab); the last
    id `eos` where given (fairseq appends </s>; OpenNMT appends nothing)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lens[0], lens[1] + 1, (count,), generator=g).tolist()
    tail = [] if eos is None else [eos]
    return [torch.randint(first_word, vocab, (n - len(tail),), generator=g).tolist() + tail for n in lengths]


def right_padded(sources: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> tokens (B, S) and the real positions (B, S) bool."""
    width = max(map(len, sources))
    tokens = torch.full((len(sources), width), pad, dtype=torch.long)
    for row, source in enumerate(sources):
        tokens[row, :len(source)] = torch.tensor(source)
    return tokens, tokens.new_tensor([len(s) for s in sources])[:, None] > torch.arange(width)


def _pick(log_probs: torch.Tensor, eos: int) -> torch.Tensor:
    """(B, V) -> (B,) the greedy tokens, the end token barred."""
    log_probs[:, eos] = -math.inf
    return log_probs.argmax(-1)


class FConvLoop:
    """fairseq's fconv encoder and incremental decoder over an FConvSeq2Seq's weights."""

    def __init__(self, model: FConvSeq2Seq):
        self.model, self.c = model, model.config
        # LinearizedConvolution's weight: (2 out, k * in), each position's k inputs oldest first
        self.linearized = [conv.weight.permute(0, 2, 1).reshape(conv.weight.shape[0], -1)
                           for conv in model.decoder.convolutions]

    def _positions(self, length: int) -> torch.Tensor:
        return torch.arange(length) + self.c.pad_token_id + 1  # fairseq's make_positions: real tokens from pad + 1

    def encode(self, tokens: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, real (B, S) -> keys transposed (B, D, S) and values (B, S, D)."""
        e = self.model.encoder
        embedded = e.embed_tokens(tokens) + e.embed_positions(self._positions(tokens.shape[1]))  # (B, S, D)
        x = e.fc1(embedded)
        residuals, padding = [x], ~real[..., None]
        for (_, k, r), proj, conv in zip(self.c.encoder_layers, e.projections, e.convolutions):
            residual = None if not r else residuals[-r] if proj is None else proj(residuals[-r])
            x = F.pad(x.masked_fill(padding, 0.0).transpose(1, 2), ((k - 1) // 2, k // 2))  # (B, in, S + k - 1)
            x = F.glu(F.conv1d(x, conv.weight, conv.bias), dim=1).transpose(1, 2)  # (B, S, out)
            if residual is not None:
                x = (x + residual) * math.sqrt(0.5)
            residuals.append(x)
        keys = e.fc2(x).masked_fill(padding, 0.0)
        return keys.transpose(1, 2), (keys + embedded) * math.sqrt(0.5)

    @torch.inference_mode()
    def greedy(self, sources: list[list[int]], new_tokens: int, eos: int = FAIRSEQ_EOS) -> list[list[int]]:
        """One batch of sources, all decoding `new_tokens` tokens -> each source's tokens."""
        d, c = self.model.decoder, self.c
        tokens, real = right_padded(sources, c.pad_token_id)
        keys_t, values = self.encode(tokens, real)
        blocked = ~real[:, None, :]  # (B, 1, S)
        scale = real.sum(1).float().sqrt()[:, None, None]  # (B, 1, 1): s * sqrt(1 / s)
        rows = len(sources)
        buffers = [torch.zeros(rows, k, width) for (_, k, _), width in zip(c.decoder_layers, _in_widths(c))]
        token = torch.full((rows,), c.decoder_start_token_id, dtype=torch.long)
        out = []
        for t in range(new_tokens):
            target = (d.embed_tokens(token) + d.embed_positions.weight[c.pad_token_id + 1 + t])[:, None]  # (B, 1, D)
            x = d.fc1(target)
            residuals = [x]
            for (_, k, r), proj, weight, conv, attention, buffer in zip(
                    c.decoder_layers, d.projections, self.linearized, d.convolutions, d.attention, buffers):
                residual = None if not r else residuals[-r] if proj is None else proj(residuals[-r])
                if k > 1:  # shift the buffer one input on
                    buffer[:, :-1] = buffer[:, 1:].clone()
                buffer[:, -1] = x[:, 0]
                x = F.glu(F.linear(buffer.view(rows, 1, -1), weight, conv.bias), dim=-1)  # (B, 1, out)
                if attention is not None:
                    q = (attention.in_projection(x) + target) * math.sqrt(0.5)
                    p = torch.softmax(torch.bmm(q, keys_t).masked_fill(blocked, -math.inf), dim=-1)  # (B, 1, S)
                    x = (attention.out_projection(torch.bmm(p, values) * scale) + x) * math.sqrt(0.5)
                if residual is not None:
                    x = (x + residual) * math.sqrt(0.5)
                residuals.append(x)
            token = _pick(torch.log_softmax(d.fc3(d.fc2(x[:, 0])), dim=-1), eos)
            out.append(token)
        return torch.stack(out, 1).tolist()


def _in_widths(c: FConvSeq2SeqConfig) -> list[int]:
    return [c.decoder_layers[0][0]] + [out for out, _, _ in c.decoder_layers[:-1]]


class OpenNMTLoop:
    """OpenNMT-py's RNNEncoder and InputFeedRNNDecoder (StackedLSTM, GlobalAttention "general") over an
    RNNSeq2Seq's weights."""

    def __init__(self, model: RNNSeq2Seq):
        self.model, self.c = model, model.config
        if self.c.rnn_type != "LSTM" or not self.c.input_feed or self.c.global_attention != "general":
            raise ValueError("the loop runs OpenNMT's LSTM with input feeding and general attention only")

    def encode(self, tokens: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, list]:
        """-> the memory bank (B, S, H) and each decoder layer's starting (h, c), each (B, H)."""
        m = self.model
        lengths = real.sum(1)
        packed = torch.nn.utils.rnn.pack_padded_sequence(m.src_embed(tokens), lengths, batch_first=True,
                                                         enforce_sorted=False)
        out, final = m.encoder(packed)
        memory, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        if self.c.bidirectional:  # RNNDecoderBase's _fix_enc_hidden: a layer's two directions side by side
            final = tuple(torch.cat([s[0::2], s[1::2]], dim=2) for s in final)
        h, c = final  # (layers, B, H)
        return memory, [(h[i], c[i]) for i in range(self.c.layers)]

    @torch.inference_mode()
    def greedy(self, sources: list[list[int]], new_tokens: int, eos: int = ONMT_EOS) -> list[list[int]]:
        m, c = self.model, self.c
        tokens, real = right_padded(sources, c.pad_token_id)
        memory, states = self.encode(tokens, real)
        blocked = ~real  # (B, S)
        feed = torch.zeros(len(sources), c.hidden_size)
        generator = m.tgt_embed.weight if m.generator is None else m.generator.weight
        token = torch.full((len(sources),), c.decoder_start_token_id, dtype=torch.long)
        out = []
        for _ in range(new_tokens):
            x = torch.cat([m.tgt_embed(token), feed], dim=1)
            for i, cell in enumerate(m.decoder):
                states[i] = cell(x, states[i])
                x = states[i][0]
            query = m.attn.linear_in(x)  # (B, H)
            scores = torch.bmm(memory, query[:, :, None])[:, :, 0].masked_fill(blocked, -math.inf)  # (B, S)
            context = torch.bmm(torch.softmax(scores, dim=-1)[:, None], memory)[:, 0]
            feed = torch.tanh(m.attn.linear_out(torch.cat([context, x], dim=1)))
            token = _pick(torch.log_softmax(F.linear(feed, generator, m.generator_bias), dim=-1), eos)
            out.append(token)
        return torch.stack(out, 1).tolist()


def loop_offline(loop: FConvLoop | OpenNMTLoop, engine: str, sources: list[list[int]], new_tokens: int,
                 batch_size: int) -> tuple[Offline, list[list[int]]]:
    """Static batches of `batch_size` in the sources' order (1: one sentence at a time), after an untimed warm-up."""
    loop.greedy(sources[:2], 2)
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(sources), batch_size):
        outputs += loop.greedy(sources[i:i + batch_size], new_tokens)
    seconds = time.perf_counter() - start
    return Offline(engine, 1, len(sources), sum(map(len, outputs)), seconds), outputs
