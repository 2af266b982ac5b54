"""PyTorch's examples/word_language_model: `RNNModel` (an embedding, an LSTM, GRU or Elman RNN, a linear
decoder with a bias, weights optionally tied), saved as `torch.save(model)` or as its state_dict.

The whole-model file names the example's classes (`model.RNNModel`) and torch.nn's; they are read as inert
records (`restricted_pickle`) and only their tensors and the `rnn_type` attribute are used. A state_dict
says the cell by its gate rows (LSTM 4*H, GRU 3*H, RNN H) but not an RNN's tanh or relu: those need the
format named (`word_language_model_rnn_tanh` / `_rnn_relu`). The example's `TransformerModel` is refused:
it is post-LN (a LayerNorm after each residual, none at the end) with sinusoidal positions and a ReLU MLP,
and Quill's transformer is pre-norm with RoPE or learned positions.

The vocabulary is not in the file (see corpus_vocabulary.py). `<eos>`, which ends every training line,
is the tokenizer's newline, not an end of sequence: a word LM continues across lines, so generation stops
at max_tokens or a stop string ("\\n" for one line), never on `<eos>`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from models.errors import CheckpointError
from models.lstm import LSTMConfig, LSTMLanguageModel

from .corpus_vocabulary import LINE_END, SPLITS, read_vocabulary, vocabulary_source
from .formats import FORMATS, ClassicFormat, Converted, find_model_file
from .pickled_module import module_tensors
from .restricted_pickle import PickledObject, attributes, load_restricted, peek_pickle
from .word_tokenizer import word_tokenizer

NAME = "word_language_model"
MODEL_FILES = ("model.pt", "model.pth")  # main.py's --save default is model.pt
NN = "torch.nn.modules."
ALLOWED = ["model.RNNModel", f"{NN}sparse.Embedding", f"{NN}rnn.LSTM", f"{NN}rnn.GRU", f"{NN}rnn.RNN",
           f"{NN}linear.Linear", f"{NN}dropout.Dropout"]
CELLS = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}  # rnn_type -> LSTMConfig.cell
GATES = {4: "LSTM", 3: "GRU"}  # gate rows per hidden unit -> rnn_type (1: a plain RNN, tanh or relu)
UNKNOWN_WORD = "<unk>"  # how wikitext, the example's corpus, writes the words it dropped


def model_file(path: Path) -> Path | None:
    return find_model_file(path, MODEL_FILES, (".pt", ".pth"))


def _is_transformer(pickled: bytes) -> bool:
    return b"TransformerModel" in pickled and b"PositionalEncoding" in pickled


def detect(path: Path) -> bool:
    file = model_file(path)
    if file is None:
        return False
    pickled = peek_pickle(file)
    whole = b"RNNModel" in pickled or _is_transformer(pickled)
    state_dict = b"rnn.weight_ih_l0" in pickled and b"encoder.weight" in pickled and b"0.encoder." not in pickled
    return whole or state_dict


def inputs(path: Path, vocab: Path | None) -> list[Path]:
    file = model_file(path)
    source = vocabulary_source(file, vocab)
    if source.is_dir():
        return [file] + [source / split for split in SPLITS if (source / split).is_file()]
    return [file, source]


def _read_tensors(file: Path, rnn_type: str | None) -> tuple[dict[str, torch.Tensor], str]:
    """(state_dict-style tensors, rnn_type) of a whole-model file or a state_dict."""
    if _is_transformer(peek_pickle(file)):
        raise CheckpointError(file, "word_language_model's TransformerModel is not supported: it is post-LN "
                                    "(LayerNorm after each residual, no final norm) with sinusoidal positions, "
                                    "and Quill's transformer is pre-norm with RoPE or learned positions")
    loaded = load_restricted(file, ALLOWED)
    if isinstance(loaded, PickledObject):
        tensors = module_tensors(loaded)
        rnn_type = rnn_type or attributes(loaded).get("rnn_type")
    elif isinstance(loaded, dict) and all(isinstance(t, torch.Tensor) for t in loaded.values()):
        tensors = dict(loaded)
    else:
        raise CheckpointError(file, f"holds a {type(loaded).__name__}, not an RNNModel or its state_dict")
    for key in ("encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "decoder.weight"):
        if key not in tensors:
            raise CheckpointError(file, f"no tensor {key}: not a word_language_model RNNModel")
    if rnn_type is None:
        hh = tensors["rnn.weight_hh_l0"]
        rnn_type = GATES.get(hh.shape[0] // hh.shape[1])
        if rnn_type is None:
            raise CheckpointError(file, "a state_dict of a plain RNN does not say its nonlinearity: name the format "
                                        f"{NAME}_rnn_tanh or {NAME}_rnn_relu (quill convert --format)")
    if rnn_type not in CELLS:
        raise CheckpointError(file, f"rnn_type {rnn_type!r} is not one of {', '.join(CELLS)}")
    return tensors, rnn_type


def _config(tensors: dict[str, torch.Tensor], rnn_type: str) -> LSTMConfig:
    vocab_size, d_embed = tensors["encoder.weight"].shape
    d_hidden = tensors["rnn.weight_hh_l0"].shape[1]
    n_layers = sum(1 for k in tensors if k.startswith("rnn.weight_ih_l"))
    encoder, decoder = tensors["encoder.weight"], tensors["decoder.weight"]
    tied = encoder.shape == decoder.shape and torch.equal(encoder, decoder)
    return LSTMConfig(vocab_size=vocab_size, d_embed=d_embed, d_hidden=d_hidden, n_layers=n_layers,
                      tie_embeddings=tied, cell=CELLS[rnn_type], output_bias="decoder.bias" in tensors)


def _quill_names(tensors: dict[str, torch.Tensor], config: LSTMConfig) -> dict[str, torch.Tensor]:
    renamed = {"embed.weight": tensors["encoder.weight"]}
    renamed |= {"lstm." + k.removeprefix("rnn."): t for k, t in tensors.items() if k.startswith("rnn.")}
    if not config.tie_embeddings:
        renamed["lm_head.weight"] = tensors["decoder.weight"]
    if config.output_bias:
        renamed["lm_bias"] = tensors["decoder.bias"]
    return {k: t.float() for k, t in renamed.items()}


def convert(path: Path, vocab: Path | None, rnn_type: str | None = None) -> Converted:
    file = model_file(path)
    if file is None:
        raise CheckpointError(path, f"no model file ({' or '.join(MODEL_FILES)}, or one .pt/.pth)")
    tensors, rnn_type = _read_tensors(file, rnn_type)
    config = _config(tensors, rnn_type)
    model = LSTMLanguageModel(config)
    try:
        model.load_state_dict(_quill_names(tensors, config), strict=True)
    except RuntimeError as e:
        raise CheckpointError(file, f"tensors do not fit an RNNModel: {e}") from None
    source = vocabulary_source(file, vocab)
    words = read_vocabulary(source)
    if len(words) != config.vocab_size:
        raise CheckpointError(source, f"gives {len(words)} words but the model has {config.vocab_size}: not the "
                                      "vocabulary it was trained with")
    tokenizer = word_tokenizer(words, unk_token=UNKNOWN_WORD if UNKNOWN_WORD in words else None,
                               newline_token=LINE_END if LINE_END in words else None)
    metadata = {"rnn_type": rnn_type, "source_file": file.name, "vocabulary": source.name}
    return Converted("lstm", model.eval(), tokenizer, metadata)


FORMATS.append(ClassicFormat(NAME, detect, convert, inputs))
for _rnn_type in ("RNN_TANH", "RNN_RELU"):  # only by name: a state_dict cannot say which
    FORMATS.append(ClassicFormat(f"{NAME}_{_rnn_type.lower()}", lambda path: False,
                                 partial(convert, rnn_type=_rnn_type), inputs))
