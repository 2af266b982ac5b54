"""PyTorch's examples/word_language_model: `RNNModel` (an embedding, an LSTM, GRU or Elman RNN, a linear
decoder with a bias, weights optionally tied) or `TransformerModel`, saved as `torch.save(model)` or as its
state_dict.

The whole-model file names the example's classes (`model.RNNModel`, `model.TransformerModel`) and torch.nn's;
they are read as inert records (`restricted_pickle`) and only their tensors and a few attributes are used
(`rnn_type`; a Transformer layer's heads, norm placement, activation and norm eps). A state_dict says the cell
by its gate rows (LSTM 4*H, GRU 3*H, RNN H) but not an RNN's tanh or relu, nor a Transformer's number of heads:
those need the format named (`word_language_model_rnn_tanh` / `_rnn_relu`, `word_language_model_nhead4`).

`TransformerModel` becomes Quill's Transformer in the original layout (quill/models/families/transformer.py): embeddings
scaled by sqrt(d_model), fixed sinusoidal positions (the stored `pe` table is checked, then computed per
step), nn.TransformerEncoderLayer's post-norm LayerNorm blocks with a ReLU MLP, no final norm, and the
decoder's bias on the logits. Its log_softmax is the server's.

The vocabulary is not in the file (see corpus_vocabulary.py). `<eos>`, which ends every training line,
is the tokenizer's newline, not an end of sequence: a word LM continues across lines, so generation stops
at max_tokens or a stop string ("\\n" for one line), never on `<eos>`.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import torch

from quill.models.loading.errors import CheckpointError
from quill.models.families.lstm import LSTMConfig, LSTMLanguageModel
from quill.models.families.transformer import TransformerConfig, TransformerLanguageModel, sinusoidal_positions

from .corpus_vocabulary import LINE_END, SPLITS, read_vocabulary, vocabulary_source
from .formats import (ClassicFormat, Converted, find_model_file, is_tied, load_weights, output_layer,
                      require_tensors)
from .pickled_module import module_tensors, submodule
from .restricted_pickle import PickledObject, attributes, load_restricted, peek_pickle
from .word_tokenizer import word_tokenizer

NAME = "word_language_model"
MODEL_FILES = ("model.pt", "model.pth")  # main.py's --save default is model.pt
NN = "torch.nn.modules."
ALLOWED = ["model.RNNModel", f"{NN}sparse.Embedding", f"{NN}rnn.LSTM", f"{NN}rnn.GRU", f"{NN}rnn.RNN",
           f"{NN}linear.Linear", f"{NN}dropout.Dropout",
           # TransformerModel; a layer keeps its activation function as an attribute, read as a name only
           "model.TransformerModel", "model.PositionalEncoding", f"{NN}transformer.TransformerEncoder",
           f"{NN}transformer.TransformerEncoderLayer", f"{NN}activation.MultiheadAttention",
           f"{NN}linear.NonDynamicallyQuantizableLinear", f"{NN}normalization.LayerNorm", f"{NN}container.ModuleList",
           "torch.nn.functional.relu", "torch.nn.functional.gelu"]
CELLS = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}  # rnn_type -> LSTMConfig.cell
GATES = {4: "LSTM", 3: "GRU"}  # gate rows per hidden unit -> rnn_type (1: a plain RNN, tanh or relu)
UNKNOWN_WORD = "<unk>"  # how wikitext, the example's corpus, writes the words it dropped
LAYERS = "transformer_encoder.layers."  # TransformerModel's encoder layers, in its state_dict
ACTIVATIONS = {"torch.nn.functional.relu": "relu", "torch.nn.functional.gelu": "gelu", "relu": "relu", "gelu": "gelu"}
NHEADS = (1, 2, 4, 8, 16)  # the formats word_language_model_nhead<N>, for a TransformerModel's state_dict


def model_file(path: Path) -> Path | None:
    return find_model_file(path, MODEL_FILES, (".pt", ".pth"))


def detect(path: Path) -> bool:
    file = model_file(path)
    if file is None:
        return False
    pickled = peek_pickle(file)
    whole = b"RNNModel" in pickled or (b"TransformerModel" in pickled and b"PositionalEncoding" in pickled)
    rnn = b"rnn.weight_ih_l0" in pickled and b"0.encoder." not in pickled
    transformer = LAYERS.encode() in pickled and b"pos_encoder.pe" in pickled
    return whole or (b"encoder.weight" in pickled and (rnn or transformer))


def inputs(path: Path, vocab: Path | None) -> list[Path]:
    file = model_file(path)
    source = vocabulary_source(file, vocab)
    if source.is_dir():
        return [file] + [source / split for split in SPLITS if (source / split).is_file()]
    return [file, source]


def _read(file: Path) -> tuple[dict[str, torch.Tensor], PickledObject | None]:
    """(state_dict-style tensors, the pickled module or None for a state_dict)."""
    loaded = load_restricted(file, ALLOWED)
    if isinstance(loaded, PickledObject):
        return module_tensors(loaded), loaded
    if isinstance(loaded, dict) and all(isinstance(t, torch.Tensor) for t in loaded.values()):
        return dict(loaded), None
    raise CheckpointError(file, f"holds a {type(loaded).__name__}, not an RNNModel, a TransformerModel or a "
                                "state_dict of one")


def _which_rnn(file: Path, tensors: dict[str, torch.Tensor], module: PickledObject | None,
               rnn_type: str | None) -> str:
    if module is not None:
        rnn_type = rnn_type or attributes(module).get("rnn_type")
    require_tensors(tensors, ("encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "decoder.weight"), file,
                    "a word_language_model RNNModel")
    if rnn_type is None:
        hh = tensors["rnn.weight_hh_l0"]
        rnn_type = GATES.get(hh.shape[0] // hh.shape[1])
        if rnn_type is None:
            raise CheckpointError(file, "a state_dict of a plain RNN does not say its nonlinearity: name the format "
                                        f"{NAME}_rnn_tanh or {NAME}_rnn_relu (quill convert --format)")
    if rnn_type not in CELLS:
        raise CheckpointError(file, f"rnn_type {rnn_type!r} is not one of {', '.join(CELLS)}")
    return rnn_type


def _config(tensors: dict[str, torch.Tensor], rnn_type: str) -> LSTMConfig:
    vocab_size, d_embed = tensors["encoder.weight"].shape
    d_hidden = tensors["rnn.weight_hh_l0"].shape[1]
    n_layers = sum(1 for k in tensors if k.startswith("rnn.weight_ih_l"))
    return LSTMConfig(vocab_size=vocab_size, d_embed=d_embed, d_hidden=d_hidden, n_layers=n_layers,
                      tie_embeddings=is_tied(tensors["encoder.weight"], tensors["decoder.weight"]),
                      cell=CELLS[rnn_type], output_bias="decoder.bias" in tensors)


def _quill_names(tensors: dict[str, torch.Tensor], config: LSTMConfig) -> dict[str, torch.Tensor]:
    renamed = {"embed.weight": tensors["encoder.weight"]}
    renamed |= {"lstm." + k.removeprefix("rnn."): t for k, t in tensors.items() if k.startswith("rnn.")}
    return renamed | output_layer(config, tensors["decoder.weight"], tensors.get("decoder.bias"))


def _layer_settings(file: Path, module: PickledObject | None, n_heads: int | None) -> dict:
    """What a TransformerModel's tensors do not say, from its first encoder layer's attributes; for a
    state_dict, the example's (nn.TransformerEncoderLayer's defaults) with the heads named by the format."""
    if module is None:
        if n_heads is None:
            raise CheckpointError(file, "a state_dict of a TransformerModel does not say its number of heads: name "
                                        f"the format {NAME}_nhead<N>, N one of {NHEADS} (quill convert --format)")
        return {"n_heads": n_heads, "activation": "relu", "norm_eps": 1e-5, "post_norm": True}
    layer = submodule(submodule(submodule(module, "transformer_encoder"), "layers"), "0")
    stored = attributes(layer)
    activation = stored.get("activation", "relu")
    activation = ACTIVATIONS.get(getattr(activation, "qualified_name", activation))
    if activation is None:
        raise CheckpointError(file, f"encoder layer activation {stored.get('activation')!r} is not relu or gelu")
    return {"n_heads": attributes(submodule(layer, "self_attn"))["num_heads"], "activation": activation,
            "norm_eps": attributes(submodule(layer, "norm1")).get("eps", 1e-5),
            "post_norm": not stored.get("norm_first", False)}


def _transformer_config(file: Path, tensors: dict[str, torch.Tensor], settings: dict) -> TransformerConfig:
    vocab_size, d_model = tensors["encoder.weight"].shape
    if d_model % settings["n_heads"]:
        raise CheckpointError(file, f"{settings['n_heads']} heads do not divide d_model {d_model}")
    pe = tensors["pos_encoder.pe"].reshape(-1, d_model)  # (max_len, 1, d_model) as the example stores it
    if not torch.allclose(pe.float(), sinusoidal_positions(torch.arange(len(pe)), d_model), atol=1e-5, rtol=0):
        raise CheckpointError(file, "pos_encoder.pe is not the sinusoidal table PositionalEncoding computes")
    n_layers = len({k.split(".")[2] for k in tensors if k.startswith(LAYERS)})
    return TransformerConfig(
        vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
        d_ff=tensors[LAYERS + "0.linear1.weight"].shape[0], max_seq_len=len(pe), positional="sinusoidal",
        norm="layernorm", final_norm="transformer_encoder.norm.weight" in tensors, gated_mlp=False, attn_bias=True,
        mlp_bias=True, embed_scale=math.sqrt(d_model), output_bias="decoder.bias" in tensors,
        tie_embeddings=is_tied(tensors["encoder.weight"], tensors["decoder.weight"]),
        extra={"source": "word_language_model TransformerModel"}, **settings)


TRANSFORMER_NAMES = {  # Quill's layer tensor -> the encoder layer's
    "attn.qkv": "self_attn.in_proj_", "attn.out": "self_attn.out_proj.", "mlp.up": "linear1.",
    "mlp.down": "linear2.", "attn_norm": "norm1.", "mlp_norm": "norm2.",
}


def _transformer_quill_names(tensors: dict[str, torch.Tensor], config: TransformerConfig) -> dict[str, torch.Tensor]:
    renamed = {"embed.weight": tensors["encoder.weight"]}
    for i in range(config.n_layers):
        for quill, theirs in TRANSFORMER_NAMES.items():
            for kind in ("weight", "bias"):
                renamed[f"layers.{i}.{quill}.{kind}"] = tensors[f"{LAYERS}{i}.{theirs}{kind}"]
    if config.final_norm:
        renamed |= {f"norm.{kind}": tensors[f"transformer_encoder.norm.{kind}"] for kind in ("weight", "bias")}
    return renamed | output_layer(config, tensors["decoder.weight"], tensors.get("decoder.bias"))


def _model(file: Path, rnn_type: str | None, n_heads: int | None) -> tuple[str, torch.nn.Module, dict]:
    """(architecture, model with the file's weights, metadata) of an RNNModel or a TransformerModel."""
    tensors, module = _read(file)
    if LAYERS + "0.self_attn.in_proj_weight" in tensors:
        require_tensors(tensors, ("encoder.weight", "pos_encoder.pe", "decoder.weight", LAYERS + "0.linear1.weight"),
                        file, "a word_language_model TransformerModel")
        config = _transformer_config(file, tensors, _layer_settings(file, module, n_heads))
        architecture, model = "transformer", TransformerLanguageModel(config)
        try:
            renamed = _transformer_quill_names(tensors, config)
        except KeyError as e:
            raise CheckpointError(file, f"no tensor {e.args[0]}: not a word_language_model TransformerModel") from None
        metadata = {"model_type": "Transformer", "n_heads": config.n_heads}
    else:
        rnn_type = _which_rnn(file, tensors, module, rnn_type)
        config = _config(tensors, rnn_type)
        architecture, model = "lstm", LSTMLanguageModel(config)
        renamed = _quill_names(tensors, config)
        metadata = {"rnn_type": rnn_type}
    load_weights(model, renamed, file, f"the example's {metadata.get('model_type', 'RNNModel')}")
    return architecture, model, metadata


def convert(path: Path, vocab: Path | None, rnn_type: str | None = None, n_heads: int | None = None) -> Converted:
    file = model_file(path)
    if file is None:
        raise CheckpointError(path, f"no model file ({' or '.join(MODEL_FILES)}, or one .pt/.pth)")
    architecture, model, metadata = _model(file, rnn_type, n_heads)
    config = model.config
    source = vocabulary_source(file, vocab)
    words = read_vocabulary(source)
    if len(words) != config.vocab_size:
        raise CheckpointError(source, f"gives {len(words)} words but the model has {config.vocab_size}: not the "
                                      "vocabulary it was trained with")
    tokenizer = word_tokenizer(words, unk_token=UNKNOWN_WORD if UNKNOWN_WORD in words else None,
                               newline_token=LINE_END if LINE_END in words else None)
    metadata |= {"source_file": file.name, "vocabulary": source.name}
    return Converted(architecture, model.eval(), tokenizer, metadata)


FORMATS = [
    ClassicFormat(NAME, detect, convert, inputs),
    # only by name: a state_dict cannot say which kind of RNN, or how many heads a TransformerModel has
    *(ClassicFormat(f"{NAME}_{rnn_type.lower()}", lambda path: False, partial(convert, rnn_type=rnn_type), inputs)
      for rnn_type in ("RNN_TANH", "RNN_RELU")),
    *(ClassicFormat(f"{NAME}_nhead{n_heads}", lambda path: False, partial(convert, n_heads=n_heads), inputs)
      for n_heads in NHEADS),
]
