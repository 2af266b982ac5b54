"""Teacher-forced, differentiable forward passes of the three encoder-decoder families, for training: a whole batch
of padded targets at once, through the families' own modules and parameters (so the weights trained here are the
weights `encode` + `step` serve; tests/models/test_seq2seq_training_forward.py holds them equal).

The families' `encode`/`step` are inference-only (paged caches, slots, inference mode); their encoders, layers and
cells are plain modules. What runs differently here is the decoder over the whole target: the Transformer's
self-attention causal under SDPA, fconv's convolutions over the whole target padded on the left, the LSTM's steps
in a loop with the teacher's tokens as inputs.

Each forward: sources (B, S) right-padded, source_lengths (B,), targets (B, T) the decoder's inputs (start token
first), right-padded -> (B, T, V) float32 log-probabilities of each next token. Rows past a target's end are
computed and left for the loss to mask.
"""

import math

import torch
import torch.nn.functional as F

from quill.models.families.fconv_seq2seq import SQRT_HALF, FConvSeq2Seq
from quill.models.families.rnn_seq2seq import RNNSeq2Seq
from quill.models.families.seq2seq import Seq2SeqTransformer


def unpack(packed: torch.Tensor, lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, D) rows packed source after source -> (B, width, D) with zeros in the padding, and the (B, width) mask
    of real rows."""
    valid = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
    out = packed.new_zeros(valid.numel(), packed.shape[-1]).index_put((valid.flatten().nonzero().squeeze(1),), packed)
    return out.view(*valid.shape, -1), valid


def _sublayer(x: torch.Tensor, norm, f, pre_norm: bool) -> torch.Tensor:
    return x + f(norm(x)) if pre_norm else norm(x + f(x))


def transformer_forward(model: Seq2SeqTransformer, sources: torch.Tensor, source_lengths: torch.Tensor,
                        targets: torch.Tensor) -> torch.Tensor:
    c = model.config
    if c.relative_buckets:
        raise ValueError("a relative-position bias (T5) is not trained here")
    heads, pre = c.n_heads, c.pre_norm
    memory, valid = unpack(model.run_encoder(sources, source_lengths), source_lengths, sources.shape[1])  # (B, S, D)
    cross_mask = valid[:, None, None, :]  # (B, 1, 1, S)
    positions = torch.arange(targets.shape[1], device=targets.device)
    x = model.decoder.embed(model.embed(targets), positions)  # (B, T, D)

    def attend(q, k, v, **mask):  # each (B, L, H, hs) -> (B, T, H * hs)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=c.scale,
                                             **mask)
        return out.transpose(1, 2).flatten(-2)

    for layer in model.decoder.layers:
        def self_attend(h, layer=layer):
            q, k, v = layer.qkv(h).unflatten(-1, (3, heads, -1)).unbind(2)
            return layer.out(attend(q, k, v, is_causal=True))

        def cross_attend(h, layer=layer):
            q = layer.cross_q(h).unflatten(-1, (heads, -1))
            k, v = layer.cross_kv(memory).unflatten(-1, (2, heads, -1)).unbind(2)
            return layer.cross_out(attend(q, k, v, attn_mask=cross_mask))

        x = _sublayer(x, layer.attn_norm, self_attend, pre)
        x = _sublayer(x, layer.cross_norm, cross_attend, pre)
        x = _sublayer(x, layer.mlp_norm, layer.mlp, pre)
    if model.decoder.final_norm is not None:
        x = model.decoder.final_norm(x)
    if c.output_scale != 1.0:
        x = x * c.output_scale
    weight = model.embed.weight if model.lm_head is None else model.lm_head.weight
    logits = F.linear(x, weight, None if model.lm_bias is None else model.lm_bias[0])
    return torch.log_softmax(logits.float(), dim=-1)


def fconv_forward(model: FConvSeq2Seq, sources: torch.Tensor, source_lengths: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
    d, width = model.decoder, sources.shape[1]
    keys, values = model.encoder(sources, source_lengths)  # (N, D) each
    keys, valid = unpack(keys, source_lengths, width)
    values, _ = unpack(values, source_lengths, width)
    length_scale = source_lengths.float().sqrt()[:, None, None].to(keys.dtype)  # fairseq's s * sqrt(1/s)
    target_embedding = d.embed(targets, torch.arange(targets.shape[1], device=targets.device))  # (B, T, D)
    x = d.fc1(target_embedding)
    outputs = [x]
    for (_, k, residual), proj, conv, attention in zip(d.layers, d.projections, d.convolutions, d.attention):
        y = F.conv1d(F.pad(x.transpose(1, 2), (k - 1, 0)), conv.weight, conv.bias)  # causal: k-1 zeros before
        y = F.glu(y.transpose(1, 2), dim=-1)  # (B, T, out)
        if attention is not None:
            q = (attention.in_projection(y) + target_embedding) * SQRT_HALF
            scores = (q @ keys.transpose(1, 2)).masked_fill(~valid[:, None, :], -math.inf)  # (B, T, S), no scale
            context = torch.softmax(scores, dim=-1) @ values
            y = (attention.out_projection(context * length_scale) + y) * SQRT_HALF
        if residual:
            skip = outputs[-residual]
            y = (y + (skip if proj is None else proj(skip))) * SQRT_HALF
        x = y
        outputs.append(x)
    return torch.log_softmax(d.logits(x), dim=-1)


def rnn_forward(model: RNNSeq2Seq, sources: torch.Tensor, source_lengths: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    c = model.config
    memory, final = model.run_encoder(sources, source_lengths.tolist())  # (N, H); (layers, B, H) per state
    values, valid = unpack(memory, source_lengths, sources.shape[1])
    keys = values if model.attn is None else model.attn.keys(values)
    mask = valid[:, None, :]  # (B, 1, S)

    def attend(query: torch.Tensor) -> torch.Tensor:  # (B, Q, H)
        return query if model.attn is None else model.attn(query, keys, values, mask)[0]

    x = model.tgt_embed(targets)  # (B, T, E)
    if c.input_feed:
        states = [tuple(s[i] for s in final) for i in range(c.layers)]  # per layer: (h, c) or (h,), each (B, H)
        feed, outs = x.new_zeros(x.shape[0], c.hidden_size), []
        for t in range(x.shape[1]):
            inp = torch.cat([x[:, t], feed], dim=-1)
            for i, cell in enumerate(model.decoder):
                end = cell(inp, states[i] if len(states[i]) == 2 else states[i][0])
                states[i] = end if isinstance(end, tuple) else (end,)
                inp = states[i][0]
            feed = attend(inp[:, None])[:, 0]
            outs.append(feed)
        out = torch.stack(outs, dim=1)
    else:
        start = tuple(s.contiguous() for s in final)
        out = attend(model.decoder(x, start if len(start) == 2 else start[0])[0])
    weight = model.tgt_embed.weight if model.generator is None else model.generator.weight
    return torch.log_softmax(F.linear(out, weight, model.generator_bias).float(), dim=-1)


TRAINING_FORWARDS = {  # architecture (a key of the family registry) -> its teacher-forced forward
    "seq2seq": transformer_forward,
    "fconv_seq2seq": fconv_forward,
    "rnn_seq2seq": rnn_forward,
}
