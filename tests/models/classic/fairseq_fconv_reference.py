"""A stand-in for fairseq's fconv_lm, written from its architecture, to make checkpoints in exactly its
format (parameter names, ConvTBC weight layout, weight norm, adaptive softmax) and to score text
the way fairseq does: the whole sequence at once, each convolution padded both sides and the
future cut off.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import weight_norm

TINY_LAYERS = "[(24, 3)] * 2 + [(32, 1)] + [(32, 4, 2)] + [(16, 2, 0)] + [(48, 3)]"  # widths, 1x1, skip 2, none
TINY_WORDS = 61  # + 4 specials = 65, padded to 72 by madeupwords
TINY_VOCAB = 72
TINY_CUTOFF = "20,40"


class ConvTBC(nn.Module):
    """fairseq's time-batch-channel convolution: weight (k, in, out)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        scale = math.sqrt(kernel_size * in_channels)
        self.weight = nn.Parameter(torch.randn(kernel_size, in_channels, out_channels) / scale)
        self.bias = nn.Parameter(torch.randn(out_channels) * 0.1)
        self.kernel_size = kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, B, C)
        out = torch.conv_tbc(x.contiguous(), self.weight, self.bias, self.kernel_size - 1)
        return out[: x.shape[0]]  # padded both sides: the last k-1 outputs see the future


def linear(in_features: int, out_features: int) -> nn.Module:
    m = nn.Linear(in_features, out_features)
    nn.init.normal_(m.bias, std=0.1)
    return weight_norm(m)


class AdaptiveSoftmax(nn.Module):
    def __init__(self, vocab_size: int, input_dim: int, cutoff: list[int], factor: float = 4.0):
        super().__init__()
        if vocab_size > cutoff[-1]:
            cutoff = cutoff + [vocab_size]
        self.cutoff = cutoff
        self.head = nn.Linear(input_dim, cutoff[0] + len(cutoff) - 1, bias=False)
        self.tail = nn.ModuleList()
        for i in range(len(cutoff) - 1):
            dim = int(input_dim // factor ** (i + 1))
            self.tail.append(nn.Sequential(nn.Linear(input_dim, dim, bias=False), nn.Dropout(0.1),
                                           nn.Linear(dim, cutoff[i + 1] - cutoff[i], bias=False)))
        self.register_buffer("version", torch.LongTensor([1]))

    def get_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        head = F.log_softmax(self.head(x), dim=-1)
        out = x.new_zeros(x.shape[0], self.cutoff[-1])
        head_size = self.cutoff[0] + len(self.tail)
        out[:, :head_size] = head
        priors = out[:, self.cutoff[0]:head_size].clone()
        for i, tail in enumerate(self.tail):
            out[:, self.cutoff[i]:self.cutoff[i + 1]] = F.log_softmax(tail(x), dim=-1) + priors[:, i, None]
        return out.view(*shape, -1)


class Decoder(nn.Module):
    def __init__(self, vocab_size, embed_dim, layers, cutoff=None, conv_norm_dim=2):
        super().__init__()
        self.layers = [tuple(spec) + (1,) * (3 - len(spec)) for spec in layers]
        self.embed_tokens = nn.Embedding(vocab_size, embed_dim, padding_idx=1)
        in_channels = self.layers[0][0]
        self.fc1 = linear(embed_dim, in_channels)
        self.projections, self.convolutions = nn.ModuleList(), nn.ModuleList()
        widths = [in_channels]
        for out_channels, kernel_size, residual in self.layers:
            source = widths[-residual] if residual else out_channels
            self.projections.append(linear(source, out_channels) if source != out_channels else None)
            conv = ConvTBC(in_channels, 2 * out_channels, kernel_size)
            self.convolutions.append(weight_norm(conv, dim=conv_norm_dim))
            in_channels = out_channels
            widths.append(out_channels)
        if cutoff:
            self.adaptive_softmax = AdaptiveSoftmax(vocab_size, in_channels, cutoff)
        else:
            self.fc2 = linear(in_channels, embed_dim)
            self.fc3 = linear(embed_dim, vocab_size)
        self.register_buffer("version", torch.Tensor([2]))

    def log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, V) log-probabilities."""
        x = self.fc1(self.embed_tokens(tokens)).transpose(0, 1)  # (T, B, C)
        outputs = [x]
        for (_, _, residual), proj, conv in zip(self.layers, self.projections, self.convolutions):
            y = F.glu(conv(x), dim=2)
            if residual:
                skip = outputs[-residual]
                y = (y + (skip if proj is None else proj(skip))) * math.sqrt(0.5)
            outputs.append(y)
            x = y
        x = x.transpose(0, 1)
        if hasattr(self, "adaptive_softmax"):
            return self.adaptive_softmax.get_log_prob(x)
        return F.log_softmax(self.fc3(self.fc2(x)), dim=-1)


class FConvLM(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.decoder = Decoder(**kwargs)

    @torch.no_grad()
    def log_probs(self, tokens: list[int]) -> torch.Tensor:
        return self.decoder.log_probs(torch.tensor([tokens]))[0]


def parse_tiny_layers() -> list[tuple]:
    return [(24, 3)] * 2 + [(32, 1)] + [(32, 4, 2)] + [(16, 2, 0)] + [(48, 3)]


def write_checkpoint(directory: Path, *, adaptive: bool = True, seed: int = 0, conv_norm_dim: int = 2,
                     args: dict | None = None, extra: dict | None = None, cfg_form: bool = False,
                     legacy_file: bool = False) -> FConvLM:
    """model.pt and dict.txt in fairseq's format, from random weights; returns the reference model."""
    torch.manual_seed(seed)
    lm = FConvLM(vocab_size=TINY_VOCAB, embed_dim=20, layers=parse_tiny_layers(),
                 cutoff=[20, 40] if adaptive else None, conv_norm_dim=conv_norm_dim).eval()
    with torch.no_grad():  # scores spread over a few units, so greedy picks are not near-ties
        lm.decoder.embed_tokens.weight.mul_(3.0)
        if adaptive:  # and clusters likely enough that tail words get picked too
            softmax = lm.decoder.adaptive_softmax
            softmax.head.weight.mul_(4.0)
            softmax.head.weight[softmax.cutoff[0]:].mul_(6.0)
            for tail in softmax.tail:
                tail[2].weight.mul_(6.0)
    fields = dict(arch="fconv_lm", task="language_modeling", decoder_embed_dim=20, decoder_layers=TINY_LAYERS,
                  decoder_out_embed_dim=256, decoder_attention="False", dropout=0.1, tokens_per_sample=512,
                  max_target_positions=512, criterion="adaptive_loss" if adaptive else "cross_entropy",
                  adaptive_softmax_cutoff=TINY_CUTOFF if adaptive else None, adaptive_softmax_dropout=0.0,
                  share_decoder_input_output_embed=False, optimizer="nag", lr=[1.0])
    fields.update(args or {})
    checkpoint = {
        "model": lm.state_dict(),
        "last_optimizer_state": {"state": {0: {"momentum_buffer": torch.zeros(3)}},
                                 "param_groups": [{"lr": 1.0, "momentum": 0.99, "params": [0]}]},
        "optimizer_history": [{"criterion_name": "AdaptiveLoss", "optimizer_name": "FairseqNAG",
                               "lr_scheduler_state": {"best": 3.5}, "num_updates": 100}],
        "extra_state": {"epoch": 2, "batch_offset": 0, "val_loss": 3.5, "train_iterator": {"epoch": 2}},
    }
    if cfg_form:
        checkpoint["args"] = None
        checkpoint["cfg"] = {"model": dict(fields, _name=fields["arch"]), "task": {"_name": "language_modeling"}}
    else:
        checkpoint["args"] = argparse.Namespace(**fields)
    checkpoint.update(extra or {})
    directory.mkdir(parents=True, exist_ok=True)
    # legacy_file: torch's format before 1.6 (one pickle, then the tensors), as the published models have
    torch.save(checkpoint, directory / "model.pt", _use_new_zipfile_serialization=not legacy_file)
    words = [f"w{i}" for i in range(TINY_WORDS)]
    (directory / "dict.txt").write_text("".join(f"{w} {1000 - i}\n" for i, w in enumerate(words)))
    return lm
