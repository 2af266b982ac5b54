"""fastai's AWD-LSTM language model (ULMFiT; the WT103 model zoo's `lstm_fwd.pth` and `itos_wt103.pkl`).

The model file is a state_dict, alone or as `{"model": ..., "opt": ...}` (the optimizer state is not used):
`0.encoder.weight`, then per layer k a single-layer LSTM `0.rnns.k.module.*` whose hidden-to-hidden weight
is weight-dropped: `0.rnns.k.weight_hh_l0_raw` is the weight (at inference the dropout is off, and the
`module.weight_hh_l0` copy, where saved, is the raw one with dropout applied when it was last run), and
`1.decoder.weight`/`.bias`, tied to the encoder. Layer sizes differ (400 -> 1152 -> 1152 -> 400), so it
becomes an LSTMConfig with layer_sizes. QRNN variants (`0.rnns.k.layers.*`) are refused.

The vocabulary is `itos` (a pickled list of strings, read with no class allowed) and the text rules are
fastai's (fastai_text.py). Nothing ends a sequence: fastai's language-model texts run on from one
`xxbos` to the next, so generation stops at max_tokens or a stop string.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from quill.models.loading.errors import CheckpointError
from quill.models.families.lstm import LSTMConfig, LSTMLanguageModel

from .fastai_text import MARKERS, UNK, FastaiTokenizer
from .formats import (ClassicFormat, Converted, find_model_file, is_tied, load_weights, output_layer,
                      require_tensors)
from .restricted_pickle import load_plain, load_restricted, peek_pickle
from .word_tokenizer import word_tokenizer

NAME = "awd_lstm"
MODEL_FILES = ("lstm_fwd.pth", "lstm_wt103.pth")  # the zoo's names (fastai v1, and older)
_LAYER = re.compile(r"^0\.rnns\.(\d+)\.")


def model_file(path: Path) -> Path | None:
    return find_model_file(path, MODEL_FILES, (".pth",))


def detect(path: Path) -> bool:
    file = model_file(path)
    pickled = peek_pickle(file) if file is not None else b""
    return b"0.rnns.0." in pickled and b"0.encoder.weight" in pickled


def vocabulary_file(file: Path, given: Path | None) -> Path:
    if given is not None:
        return given
    candidates = sorted(file.parent.glob("itos*.pkl"))
    if len(candidates) != 1:
        found = f" (found {', '.join(p.name for p in candidates)})" if candidates else ""
        raise CheckpointError(file, f"no vocabulary: put fastai's itos file (itos_wt103.pkl) beside the model, or "
                                    f"give it with --vocab{found}")
    return candidates[0]


def inputs(path: Path, vocab: Path | None) -> list[Path]:
    file = model_file(path)
    return [file, vocabulary_file(file, vocab)]


def _state_dict(file: Path) -> dict[str, torch.Tensor]:
    loaded = load_restricted(file)
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        loaded = loaded["model"]  # learner.save(with_opt=True); "opt" is not read
    if not isinstance(loaded, dict) or not all(isinstance(t, torch.Tensor) for t in loaded.values()):
        raise CheckpointError(file, "not a fastai state_dict (tensors by name, or {'model': ..., 'opt': ...})")
    if any(".layers." in k for k in loaded if k.startswith("0.rnns.")):
        raise CheckpointError(file, "a QRNN AWD-LSTM: Quill serves the LSTM variant only")
    return loaded


def _layer(tensors: dict[str, torch.Tensor], k: int, name: str, file: Path) -> torch.Tensor:
    keys = [f"0.rnns.{k}.weight_hh_l0_raw", f"0.rnns.{k}.module.weight_hh_l0"] if name == "weight_hh_l0" \
        else [f"0.rnns.{k}.module.{name}"]
    tensor = next((tensors[key] for key in keys if key in tensors), None)
    if tensor is None:
        raise CheckpointError(file, f"no tensor {keys[0]}")
    return tensor


def convert(path: Path, vocab: Path | None) -> Converted:
    file = model_file(path)
    if file is None:
        raise CheckpointError(path, f"no model file ({' or '.join(MODEL_FILES)}, or one .pth)")
    tensors = _state_dict(file)
    require_tensors(tensors, ("0.encoder.weight", "1.decoder.weight"), file, "a fastai AWD-LSTM language model")
    n_layers = 1 + max(int(m.group(1)) for k in tensors if (m := _LAYER.match(k)))
    weights = {"embed.weight": tensors["0.encoder.weight"]}
    for k in range(n_layers):
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            weights[f"layers.{k}.{name}"] = _layer(tensors, k, name, file)
    sizes = [weights[f"layers.{k}.weight_hh_l0"].shape[1] for k in range(n_layers)]
    encoder, decoder = tensors["0.encoder.weight"], tensors["1.decoder.weight"]
    config = LSTMConfig(vocab_size=encoder.shape[0], d_embed=encoder.shape[1], layer_sizes=sizes,
                        tie_embeddings=is_tied(encoder, decoder), output_bias="1.decoder.bias" in tensors)
    weights |= output_layer(config, decoder, tensors.get("1.decoder.bias"))
    model = LSTMLanguageModel(config)
    load_weights(model, weights, file, "an AWD-LSTM")
    source = vocabulary_file(file, vocab)
    itos = load_plain(source)
    if not isinstance(itos, list) or not all(isinstance(w, str) for w in itos):
        raise CheckpointError(source, "not a fastai itos (a pickled list of strings)")
    if len(itos) != config.vocab_size:
        raise CheckpointError(source, f"has {len(itos)} words but the model has {config.vocab_size}: not the "
                                      "vocabulary it was trained with")
    words = word_tokenizer(itos, unk_token=UNK if UNK in itos else None, special_tokens=MARKERS)
    metadata = {"text_rules": FastaiTokenizer.text_rules, "source_file": file.name, "vocabulary": source.name,
                "layer_sizes": sizes}
    return Converted("lstm", model.eval(), FastaiTokenizer(words), metadata)


FORMATS = [ClassicFormat(NAME, detect, convert, inputs)]
