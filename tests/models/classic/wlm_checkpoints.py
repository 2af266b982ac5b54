"""Tiny checkpoints of PyTorch's examples/word_language_model, saved as the example saves them.

`model.py` below is the example's RNNModel (the parts a saved model and a forward pass need), written into
a directory of its own and imported from there as the module `model`, so `torch.save(model)` names
`model.RNNModel` as main.py's file does; then the module is forgotten, so nothing can import it back.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

MODEL_PY = '''
import torch.nn as nn


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


def build_rnn_model(code_dir: Path, rnn_type: str, n_layers: int = 2, d_hidden: int = 16, tied: bool = False,
                    seed: int = 0) -> torch.nn.Module:
    """An RNNModel of the example's class (module `model`, from `code_dir`), in eval mode."""
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "model.py").write_text(MODEL_PY)
    sys.path.insert(0, str(code_dir))
    try:
        sys.modules.pop("model", None)
        module = importlib.import_module("model")
        torch.manual_seed(seed)
        model = module.RNNModel(rnn_type, len(WORDS), d_hidden if tied else 12, d_hidden, n_layers, dropout=0.2,
                                tie_weights=tied)
    finally:
        sys.path.remove(str(code_dir))
    with torch.no_grad():  # sharper than the initial weights, so greedy and beam paths are not ties of noise
        model.decoder.weight.mul_(6.0 if not tied else 1.0)
        model.encoder.weight.mul_(2.0 if tied else 1.0)
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
    """(T, V) logits by the example's own forward (sequence-first, batch of one)."""
    out, _ = model(torch.tensor(tokens).unsqueeze(1), model.init_hidden(1))
    return out[:, 0]


@torch.no_grad()
def reference_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
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
