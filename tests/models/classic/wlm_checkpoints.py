"""Tiny checkpoints of PyTorch's examples/word_language_model, saved as the example saves them.

`model.py` below is the example's RNNModel and TransformerModel with its PositionalEncoding (the parts a saved
model and a forward pass need, as the example writes them), written into
a directory of its own and imported from there as the module `model`, so `torch.save(model)` names
`model.RNNModel` as main.py's file does; then the module is forgotten, so nothing can import it back.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import torch

MODEL_PY = '''
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ["LSTM", "GRU"]:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}[rnn_type]
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        return self.decoder(output), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__()
        from torch.nn import TransformerEncoder, TransformerEncoderLayer
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        encoder_layers = TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
        mask = mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, float(0.0))
        return mask

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None
        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)
'''

# A corpus whose vocabulary order data.Corpus decides: train, valid, test; <eos> after every line.
CORPUS = {
    "train.txt": "\n the cat sat on the mat \n the dog ate my <unk> homework \n\n",
    "valid.txt": " a cat and a dog \n",
    "test.txt": " the end of it all \n",
}
# What data.Corpus gives for CORPUS: ids in order of first appearance.
WORDS = ["<eos>", "the", "cat", "sat", "on", "mat", "dog", "ate", "my", "<unk>", "homework", "a", "and",
         "end", "of", "it", "all"]


def write_corpus(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in CORPUS.items():
        (directory / name).write_text(text)
    return directory


def _example_module(code_dir: Path):
    """The example's model.py, imported from `code_dir` as the module `model` (forgotten by `save_whole`)."""
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "model.py").write_text(MODEL_PY)
    sys.path.insert(0, str(code_dir))
    try:
        sys.modules.pop("model", None)
        return importlib.import_module("model")
    finally:
        sys.path.remove(str(code_dir))


def build_rnn_model(code_dir: Path, rnn_type: str, n_layers: int = 2, d_hidden: int = 16, tied: bool = False,
                    seed: int = 0) -> torch.nn.Module:
    """An RNNModel of the example's class (module `model`, from `code_dir`), in eval mode."""
    module = _example_module(code_dir)
    torch.manual_seed(seed)
    model = module.RNNModel(rnn_type, len(WORDS), d_hidden if tied else 12, d_hidden, n_layers, dropout=0.2,
                            tie_weights=tied)
    with torch.no_grad():  # sharper than the initial weights, so greedy and beam paths are not ties of noise
        model.decoder.weight.mul_(6.0 if not tied else 1.0)
        model.encoder.weight.mul_(2.0 if tied else 1.0)
    return model.eval()


def build_transformer_model(code_dir: Path, nhead: int = 2, n_layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A TransformerModel of the example's class, built as main.py builds one (ninp 16, nhid 24), in eval mode,
    after one forward pass in training mode, so its pickle holds the `src_mask` tensor as a trained model's does."""
    module = _example_module(code_dir)
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # nn.TransformerEncoder's advice to use batch_first, which the example does not
        warnings.simplefilter("ignore", UserWarning)
        model = module.TransformerModel(len(WORDS), 16, nhead, 24, n_layers, dropout=0.2)
    model(torch.tensor([[1], [2], [3]]))
    with torch.no_grad():  # sharper than the initial weights, so greedy and beam paths are not ties of noise
        model.decoder.weight.mul_(20.0)
        model.decoder.bias.uniform_(-0.5, 0.5)
    return model.eval()


def save_whole(model: torch.nn.Module, path: Path) -> Path:
    """As main.py saves: `torch.save(model, f)`; then `model` is forgotten, as in a fresh process."""
    with open(path, "wb") as f:
        torch.save(model, f)
    sys.modules.pop("model", None)
    return path


def save_state_dict(model: torch.nn.Module, path: Path) -> Path:
    torch.save(model.state_dict(), path)
    return path


@torch.no_grad()
def reference_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """(T, V) logits by the example's own forward (sequence-first, batch of one); a TransformerModel's are
    log-probabilities, under its causal mask."""
    if not hasattr(model, "init_hidden"):
        return model(torch.tensor(tokens).unsqueeze(1), has_mask=True)[:, 0]
    out, _ = model(torch.tensor(tokens).unsqueeze(1), model.init_hidden(1))
    return out[:, 0]


@torch.no_grad()
def reference_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    if not hasattr(model, "init_hidden"):  # a TransformerModel: the whole sequence again, as main.py generates
        tokens = []
        for _ in range(max_tokens):
            tokens.append(int(reference_logits(model, prompt + tokens)[-1].argmax()))
        return tokens
    out, hidden = model(torch.tensor(prompt).unsqueeze(1), model.init_hidden(1))
    tokens = []
    for _ in range(max_tokens):
        tokens.append(int(out[-1, 0].argmax()))
        out, hidden = model(torch.tensor([[tokens[-1]]]), hidden)
    return tokens


@torch.no_grad()
def reference_beam(logits, prompt: list[int], width: int, max_tokens: int) -> list[tuple[list[int], float]]:
    """Beam search with no end-of-sequence over `logits(token_ids) -> (T, V)`: the `width` best continuations
    of `max_tokens` tokens with their summed log-probabilities, best first (what any beam search returns when
    nothing ends early)."""
    beams = [([], 0.0)]
    for _ in range(max_tokens):
        candidates = []
        for tokens, score in beams:
            logprobs = torch.log_softmax(logits(prompt + tokens)[-1].double(), -1)
            candidates += [(tokens + [t], score + float(logprobs[t])) for t in range(len(logprobs))]
        beams = sorted(candidates, key=lambda c: -c[1])[:width]
    return beams
