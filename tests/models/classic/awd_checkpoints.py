"""Tiny checkpoints of fastai's AWD-LSTM, with the key names and file layout of the WT103 model zoo's
`lstm_fwd.pth` (a state_dict inside {"model", "opt"}) and `itos_wt103.pkl` (a pickled list of strings),
and the architecture's forward written out from its parts (embedding, one nn.LSTM per layer, decoder)."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

MARKERS = ["xxunk", "xxpad", "xxbos", "xxeos", "xxfld", "xxmaj", "xxup", "xxrep", "xxwrep"]  # fastai's order
ITOS = MARKERS + ["the", ".", ",", "cat", "sat", "on", "mat", "i", "it", "'s", "a", "dog", "n't", "do", "(", ")",
                  "nasa", "said", "\n", "!", "4", "3"]


class AwdLstm(nn.Module):
    """fastai's AWD_LSTM + LinearDecoder at inference (every dropout off)."""

    def __init__(self, vocab_size: int, emb: int, hidden: int, n_layers: int, tied: bool = True):
        super().__init__()
        self.encoder = nn.Embedding(vocab_size, emb)
        sizes = [emb] + [hidden] * (n_layers - 1) + [emb]
        self.rnns = nn.ModuleList(nn.LSTM(sizes[k], sizes[k + 1], 1, batch_first=True) for k in range(n_layers))
        self.decoder = nn.Linear(emb, vocab_size)
        if tied:
            self.decoder.weight = self.encoder.weight

    def forward(self, tokens: torch.Tensor, hidden=None):
        out, hidden = self.encoder(tokens), list(hidden or [None] * len(self.rnns))
        for k, rnn in enumerate(self.rnns):
            out, hidden[k] = rnn(out, hidden[k])
        return self.decoder(out), hidden


def build_awd(seed: int = 0, tied: bool = True) -> AwdLstm:
    torch.manual_seed(seed)
    model = AwdLstm(len(ITOS), 8, 12, 3, tied)
    with torch.no_grad():
        model.encoder.weight.mul_(3.0)  # sharper than the initial weights: greedy and beam paths are not ties
    return model.eval()


def fastai_state_dict(model: AwdLstm) -> OrderedDict:
    """The model's tensors under fastai's names, the weight-dropped copies included (deliberately different
    from the raw weights, as a dropout mask leaves them: the raw ones are the weights)."""
    sd = OrderedDict()
    sd["0.encoder.weight"] = model.encoder.weight.detach().clone()
    sd["0.encoder_dp.emb.weight"] = sd["0.encoder.weight"]
    for k, rnn in enumerate(model.rnns):
        sd[f"0.rnns.{k}.weight_hh_l0_raw"] = rnn.weight_hh_l0.detach().clone()
        sd[f"0.rnns.{k}.module.weight_ih_l0"] = rnn.weight_ih_l0.detach().clone()
        sd[f"0.rnns.{k}.module.weight_hh_l0"] = torch.nn.functional.dropout(rnn.weight_hh_l0.detach(), 0.5)
        sd[f"0.rnns.{k}.module.bias_ih_l0"] = rnn.bias_ih_l0.detach().clone()
        sd[f"0.rnns.{k}.module.bias_hh_l0"] = rnn.bias_hh_l0.detach().clone()
    sd["1.decoder.weight"] = model.decoder.weight.detach().clone()
    sd["1.decoder.bias"] = model.decoder.bias.detach().clone()
    return sd


def save_awd(model: AwdLstm, directory: Path, with_opt: bool = True, legacy: bool = False) -> Path:
    """lstm_fwd.pth and itos_wt103.pkl in `directory`, as learner.save and the model zoo have them (`legacy`:
    in the pre-zip torch.save format of PyTorch before 1.6, which the zoo's 2019 files were written in)."""
    directory.mkdir(parents=True, exist_ok=True)
    sd = fastai_state_dict(model)
    opt = {"opt_state": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 1e-3}]}, "lr": [1e-3]}
    torch.save({"model": sd, "opt": opt} if with_opt else sd, directory / "lstm_fwd.pth",
               _use_new_zipfile_serialization=not legacy)
    with open(directory / "itos_wt103.pkl", "wb") as f:
        pickle.dump(list(ITOS), f)
    return directory


@torch.no_grad()
def awd_logits(model: AwdLstm, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens]))[0][0]


@torch.no_grad()
def awd_greedy(model: AwdLstm, prompt: list[int], max_tokens: int) -> list[int]:
    out, hidden = model(torch.tensor([prompt]))
    tokens = []
    for _ in range(max_tokens):
        tokens.append(int(out[0, -1].argmax()))
        out, hidden = model(torch.tensor([[tokens[-1]]]), hidden)
    return tokens
