"""fairseq's `fconv_lm` checkpoints (`model.pt` beside `dict.txt`): the gated convolutional language
models of Dauphin et al., e.g. the published `fconv_lm_dauphin_wikitext103` and Billion Word models.

model.pt is a dict: the training arguments (`args`, an argparse.Namespace; or, from newer fairseq,
`cfg` whose `model` holds the same fields, as a plain dict or a Namespace), the decoder's state dict
(`model`), and optimizer state (`last_optimizer_state`, `optimizer_history`, `extra_state`), which is
unpickled with the rest (torch.load reads the whole file) but never used. `cfg` saved as an
omegaconf DictConfig needs omegaconf's classes and is refused by name.

The architecture is read from the arguments (`decoder_layers`, parsed without eval) and checked
against the state dict, which decides the sizes: the vocabulary (the embedding's rows) and each
adaptive-softmax cluster's width. Weight normalisation is folded into plain weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quill.models.loading.errors import CheckpointError
from quill.models.families.fconv import FConvConfig, FConvLanguageModel

from .fairseq_dictionary import dictionary_tokenizer, pad_dictionary, read_dictionary
from .formats import ClassicFormat, Converted, load_weights
from .literal_expression import ExpressionError, literal_expression
from .restricted_pickle import attributes, load_restricted, peek_pickle
from .weight_norm import fold_weight_norms

MODEL_FILE, DICT_FILE = "model.pt", "dict.txt"
ALLOWED_CLASSES = ("argparse.Namespace",)
FAIRSEQ_DEFAULT_LAYERS = "[(1268, 4)] * 13"  # base_lm_architecture's, for arguments that leave it out
PREFIX = "decoder."


def _files(path: Path, vocab: Path | None) -> tuple[Path, Path]:
    model = path / MODEL_FILE if path.is_dir() else path
    if vocab is None:
        vocab = model.parent / DICT_FILE
    elif vocab.is_dir():
        vocab = vocab / DICT_FILE
    return model, vocab


def detect(path: Path) -> bool:
    model, vocab = _files(path, None)
    # the arguments, pickled before the tensors, name the architecture (`arch`)
    return model.is_file() and vocab.is_file() and b"fconv" in peek_pickle(model)


def model_args(checkpoint: dict, path: Path) -> dict:
    """The model's arguments: `args`, or newer fairseq's `cfg["model"]`."""
    args = checkpoint.get("args")
    if args is None:
        cfg = checkpoint.get("cfg")
        if not isinstance(cfg, dict) or cfg.get("model") is None:
            raise CheckpointError(path, "neither `args` nor a `cfg` dict with `model` in it: not a fairseq checkpoint")
        args = cfg["model"]
    try:
        return dict(attributes(args))
    except TypeError:
        raise CheckpointError(path, f"the model arguments are a {type(args).__name__}, not a record") from None


def parse_argument(args: dict, name: str, path: Path, default: str | None = None) -> object:
    value = args.get(name, default)
    if isinstance(value, str):
        try:
            return literal_expression(value)
        except ExpressionError as e:
            raise CheckpointError(path, f"{name}: {e}") from None
    return value


def _layers(args: dict, path: Path) -> list[list[int]]:
    spec = parse_argument(args, "decoder_layers", path, FAIRSEQ_DEFAULT_LAYERS)
    def is_layer(layer) -> bool:
        return isinstance(layer, (list, tuple)) and len(layer) in (2, 3) and all(type(n) is int for n in layer)

    if not isinstance(spec, (list, tuple)) or not spec or not all(is_layer(layer) for layer in spec):
        raise CheckpointError(path, f"decoder_layers {args.get('decoder_layers')!r}: must be a list of "
                                    "(out_channels, kernel_size) or (out_channels, kernel_size, residual)")
    return [[*layer, 1][:3] for layer in spec]  # fairseq's default residual: the layer's own input


def _check_no_attention(args: dict, path: Path) -> None:
    attention = parse_argument(args, "decoder_attention", path, "False")
    if attention in (False, None) or (isinstance(attention, (list, tuple)) and not any(attention)):
        return
    raise CheckpointError(path, f"decoder_attention {args.get('decoder_attention')!r}: a language model's "
                                "decoder attends to no encoder, so Quill reads only decoder_attention False")


def _decoder_state(checkpoint: dict, path: Path) -> dict[str, torch.Tensor]:
    state = checkpoint.get("model")
    if not isinstance(state, dict):
        raise CheckpointError(path, "no `model` state dict")
    not_tensors = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(path, f"state dict entries that are not tensors: {', '.join(not_tensors[:5])}")
    outside = [k for k in state if not k.startswith(PREFIX)]
    if outside:
        raise CheckpointError(path, f"state dict keys outside the decoder: {', '.join(outside[:5])}")
    state = {k[len(PREFIX):]: v for k, v in state.items()}
    if "embed_positions.weight" in state:
        raise CheckpointError(path, "the decoder has position embeddings (decoder.embed_positions), which fairseq's "
                                    "fconv_lm never builds: not an fconv_lm checkpoint")
    state.pop("version", None)  # decoder format version: which weight-norm dimension, read from the shapes
    try:
        return fold_weight_norms(state)
    except ValueError as e:
        raise CheckpointError(path, str(e)) from None


def _adaptive_softmax(state: dict, args: dict, vocab_size: int, path: Path) -> tuple[list, list] | tuple[None, None]:
    """(cutoffs with vocab_size last, each tail's inner width) from the state dict; (None, None) without one."""
    if "adaptive_softmax.head.weight" not in state:
        return None, None
    if "adaptive_softmax.version" not in state:
        raise CheckpointError(path, "adaptive softmax without decoder.adaptive_softmax.version: saved by a fairseq "
                                    "old enough that fairseq itself no longer loads it (its cluster order differs)")
    state.pop("adaptive_softmax.version")
    cutoff = parse_argument(args, "adaptive_softmax_cutoff", path)
    if isinstance(cutoff, int):
        cutoff = [cutoff]
    if not isinstance(cutoff, (list, tuple)) or not all(type(n) is int for n in cutoff):
        raise CheckpointError(path, f"adaptive_softmax_cutoff {args.get('adaptive_softmax_cutoff')!r} "
                                    "is not a list of word ids")
    cutoff = list(cutoff) + ([vocab_size] if vocab_size > cutoff[-1] else [])
    dims = []
    for i, (start, end) in enumerate(zip(cutoff, cutoff[1:])):
        proj, out = state.get(f"adaptive_softmax.tail.{i}.0.weight"), state.get(f"adaptive_softmax.tail.{i}.2.weight")
        if proj is None or out is None or out.shape != (end - start, proj.shape[0]):
            raise CheckpointError(path, f"adaptive softmax tail {i} does not match cutoffs {cutoff}")
        dims.append(proj.shape[0])
        state[f"adaptive_softmax.tail.{i}.proj.weight"] = state.pop(f"adaptive_softmax.tail.{i}.0.weight")
        state[f"adaptive_softmax.tail.{i}.out.weight"] = state.pop(f"adaptive_softmax.tail.{i}.2.weight")
    return cutoff, dims


def _conv_weights(state: dict, num_layers: int) -> None:
    """fairseq's convolutions are ConvTBC, weight (k, in, 2*out): ours are nn.Conv1d's (2*out, in, k)."""
    for i in range(num_layers):
        key = f"convolutions.{i}.weight"
        if key in state:
            state[key] = state[key].permute(2, 1, 0).contiguous()


def convert(path: Path, vocab: Path | None) -> Converted:
    model_file, dict_file = _files(path, vocab)
    for file in (model_file, dict_file):
        if not file.is_file():
            raise CheckpointError(file, "missing file")
    try:
        checkpoint = load_restricted(model_file, ALLOWED_CLASSES)
    except CheckpointError as e:
        if "omegaconf" not in e.problem:
            raise
        raise CheckpointError(model_file, f"{e.problem}; fairseq keeps `cfg` as a plain dict when it saves "
                                          "(OmegaConf.to_container): re-save it so") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(model_file, f"holds a {type(checkpoint).__name__}, not a fairseq checkpoint dict")
    args = model_args(checkpoint, model_file)
    arch = args.get("arch", args.get("_name"))  # newer fairseq's cfg names the architecture `_name`
    if arch is not None and not str(arch).startswith("fconv_lm"):
        raise CheckpointError(model_file, f"fairseq architecture {arch!r}: Quill reads fconv_lm models here")
    layers = _layers(args, model_file)
    _check_no_attention(args, model_file)
    state = _decoder_state(checkpoint, model_file)
    embed = state.get("embed_tokens.weight")
    if embed is None:
        raise CheckpointError(model_file, "no decoder.embed_tokens.weight")
    vocab_size, embed_dim = embed.shape
    cutoff, dims = _adaptive_softmax(state, args, vocab_size, model_file)
    _conv_weights(state, len(layers))
    config = FConvConfig(
        vocab_size=vocab_size, embed_dim=embed_dim, layers=layers,
        out_embed_dim=state["fc2.weight"].shape[0] if "fc2.weight" in state else embed_dim,
        adaptive_softmax_cutoff=cutoff, adaptive_softmax_dims=dims,
        normalization_constant=float(args.get("normalization_constant", 0.5)),
    )
    with torch.device("meta"):
        model = FConvLanguageModel(config)
    load_weights(model, state, model_file, f"decoder_layers {layers}", assign=True)
    model.eval().requires_grad_(False)
    words = read_dictionary(dict_file)
    metadata = {"fairseq_arch": arch, "dictionary_words": len(words), "padding_words": vocab_size - len(words)}
    return Converted("fconv", model, dictionary_tokenizer(pad_dictionary(words, vocab_size, dict_file)), metadata)


FORMAT = ClassicFormat("fconv_lm", detect, convert)
FORMATS = [FORMAT]
