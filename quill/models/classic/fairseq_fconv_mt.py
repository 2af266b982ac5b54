"""fairseq's convolutional translation models (`fconv`, `fconv_iwslt_de_en`, `fconv_wmt_en_ro`, `fconv_wmt_en_de`,
`fconv_wmt_en_fr`, e.g. the published WMT'14 En-Fr and En-De and WMT'17 En-De models) built from a checkpoint's
model arguments and `model` state dict; reading the file, its dictionaries and its BPE is the format's job.

The arguments give the layers as the strings fairseq passes to eval (`encoder_layers`, `decoder_layers`,
`decoder_attention`), parsed here without running them; a field they leave out takes its architecture's default,
as fairseq fills it before building. The state dict decides the vocabularies and the position tables and is
checked against the arguments. Weight normalisation is folded into plain weights (its dimension read from the
shapes, so old decoders, `version` 1, fold as well as new ones), ConvTBC weights (k, in, 2*out) become Conv1d's
(2*out, in, k), and the `version` entries are dropped.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quill.models.families.fconv_seq2seq import FConvSeq2Seq, FConvSeq2SeqConfig, in_channels
from quill.models.loading.errors import CheckpointError

from .formats import load_weights
from .literal_expression import ExpressionError, literal_expression
from .weight_norm import fold_weight_norms

_BASE = {"encoder_embed_dim": 512, "encoder_layers": "[(512, 3)] * 20", "decoder_embed_dim": 512,
         "decoder_layers": "[(512, 3)] * 20", "decoder_out_embed_dim": 256, "decoder_attention": "True",
         "share_input_output_embed": False}
_WMT_EN_DE = "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2"
_WMT_EN_FR = "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1"
# fairseq's register_model_architecture("fconv", ...) functions: what each sets where the arguments say nothing
ARCHITECTURE_DEFAULTS = {
    "fconv": _BASE,
    "fconv_iwslt_de_en": {**_BASE, "encoder_embed_dim": 256, "encoder_layers": "[(256, 3)] * 4",
                          "decoder_embed_dim": 256, "decoder_layers": "[(256, 3)] * 3"},
    "fconv_wmt_en_ro": {**_BASE, "decoder_out_embed_dim": 512},
    "fconv_wmt_en_de": {**_BASE, "encoder_embed_dim": 768, "encoder_layers": _WMT_EN_DE, "decoder_embed_dim": 768,
                        "decoder_layers": _WMT_EN_DE, "decoder_out_embed_dim": 512},
    "fconv_wmt_en_fr": {**_BASE, "encoder_embed_dim": 768, "encoder_layers": _WMT_EN_FR, "decoder_embed_dim": 768,
                        "decoder_layers": _WMT_EN_FR, "decoder_out_embed_dim": 512},
}
STACKS = ("encoder", "decoder")
PAD = 1  # fairseq's Dictionary numbers <pad> 1 (<s> 0, </s> 2, <unk> 3): the position tables are read past it


def _given(args: dict, defaults: dict, name: str) -> object:
    """An argument as it is stored, its architecture's default where absent."""
    return defaults[name] if args.get(name) is None else args[name]


def _field(args: dict, defaults: dict, name: str, path: Path) -> object:
    """An argument, or its default, with strings parsed as fairseq's expressions."""
    value = _given(args, defaults, name)
    if isinstance(value, str):
        try:
            return literal_expression(value)
        except ExpressionError as e:
            raise CheckpointError(path, f"{name}: {e}") from None
    return value


def _layers(args: dict, defaults: dict, name: str, path: Path) -> list[list[int]]:
    spec = _field(args, defaults, name, path)

    def is_layer(layer) -> bool:
        return isinstance(layer, (list, tuple)) and len(layer) in (2, 3) and all(type(n) is int for n in layer)

    if not isinstance(spec, (list, tuple)) or not spec or not all(is_layer(layer) for layer in spec):
        raise CheckpointError(path, f"{name} {args.get(name)!r}: must be a list of (out_channels, kernel_size) or "
                                    "(out_channels, kernel_size, residual)")
    return [[*layer, 1][:3] for layer in spec]  # fairseq's default residual: the layer's own input


def _attention(args: dict, defaults: dict, num_layers: int, path: Path) -> list[bool]:
    spec = _field(args, defaults, "decoder_attention", path)
    if isinstance(spec, bool):
        return [spec] * num_layers
    if not isinstance(spec, (list, tuple)) or len(spec) != num_layers or not all(isinstance(a, bool) for a in spec):
        raise CheckpointError(path, f"decoder_attention {args.get('decoder_attention')!r}: must be True, False or "
                                    f"a list of one boolean per decoder layer ({num_layers})")
    return list(spec)


def _plain_state(state: dict, path: Path) -> dict[str, torch.Tensor]:
    not_tensors = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(path, f"state dict entries that are not tensors: {', '.join(not_tensors[:5])}")
    outside = [k for k in state if k.split(".")[0] not in STACKS]
    if outside:
        raise CheckpointError(path, f"state dict keys outside the encoder and decoder: {', '.join(outside[:5])}")
    adaptive = [k for k in state if k.startswith("decoder.adaptive_softmax.")]
    if adaptive:
        raise CheckpointError(path, f"an adaptive softmax ({adaptive[0]}): fairseq's fconv translation models "
                                    "have fc2 and fc3, and Quill reads only those")
    # the decoder's format version: which weight-norm dimension, which the shapes tell as well
    state = {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] != "version"}
    try:
        return fold_weight_norms(state)
    except ValueError as e:
        raise CheckpointError(path, str(e)) from None


def _table(state: dict, key: str, path: Path) -> torch.Tensor:
    table = state.get(key)
    if table is None or table.dim() != 2:
        raise CheckpointError(path, f"no {key} (a 2-d table)" if table is None else f"{key} is not a 2-d table")
    return table


def _check_width(state: dict, key: str, args: dict, name: str, default: int, path: Path) -> int:
    """An embedding's width, which must be the argument's (or its default)."""
    width = _table(state, key, path).shape[1]
    wanted = default if args.get(name) is None else args[name]
    if width != wanted:
        raise CheckpointError(path, f"{key} is {width} wide, but {name} is {wanted}")
    return width


def _positions(state: dict, stack: str, args: dict, name: str, width: int, pad: int, path: Path) -> int:
    """The longest sequence a stack's position table reaches (fairseq: its rows less pad + 1)."""
    key = f"{stack}.embed_positions.weight"
    rows, table_width = _table(state, key, path).shape
    if table_width != width:
        raise CheckpointError(path, f"{key} is {table_width} wide, but the {stack}'s embeddings are {width}")
    if args.get(name) is not None and args[name] != rows:
        raise CheckpointError(path, f"{key} has {rows} rows, but {name} is {args[name]}")
    if rows <= pad + 1:
        raise CheckpointError(path, f"{key} has {rows} rows: no position past the padding")
    return rows - pad - 1


def _check_convolutions(state: dict, stack: str, layers: list[list[int]], spec: str, path: Path) -> None:
    """Each of a stack's ConvTBC weights (k, in, 2*out) as its layer says, and no more layers than it lists."""
    for i, ((out_channels, kernel_size, _), width) in enumerate(zip(layers, in_channels(layers))):
        key = f"{stack}.convolutions.{i}.weight"
        wanted = (kernel_size, width, 2 * out_channels)
        if key not in state:
            raise CheckpointError(path, f"no {key}, but {stack}_layers {spec} has {len(layers)} layers")
        if tuple(state[key].shape) != wanted:
            raise CheckpointError(path, f"{key} has shape {tuple(state[key].shape)}, but layer {i} of {stack}_layers "
                                        f"{spec} (out_channels {out_channels}, kernel {kernel_size}, input {width}) "
                                        f"needs {wanted}")
    extra = f"{stack}.convolutions.{len(layers)}.weight"
    if extra in state:
        raise CheckpointError(path, f"{extra} is there, but {stack}_layers {spec} has only {len(layers)} layers")


def _check_attention(state: dict, attention: list[bool], spec: str, path: Path) -> None:
    weighted = sorted({int(k.split(".")[2]) for k in state
                       if k.startswith("decoder.attention.") and k.split(".")[2].isdigit()})
    listed = [i for i, attends in enumerate(attention) if attends]
    if weighted != listed:
        raise CheckpointError(path, f"decoder_attention {spec} attends at decoder layers {listed}, but the state dict "
                                    f"has attention weights at layers {weighted}")


def _convert(state: dict, config: FConvSeq2SeqConfig, path: Path) -> dict[str, torch.Tensor]:
    """fairseq's names and layouts -> the model's: ConvTBC weights permuted, a shared fc3 as its bias alone."""
    for stack in STACKS:
        for i in range(len(getattr(config, f"{stack}_layers"))):
            key = f"{stack}.convolutions.{i}.weight"
            state[key] = state[key].permute(2, 1, 0).contiguous()
    if config.share_input_output_embed:
        fc3 = state.pop("decoder.fc3.weight", None)
        if fc3 is not None and not torch.equal(fc3, state["decoder.embed_tokens.weight"]):
            raise CheckpointError(path, "share_input_output_embed is set, but decoder.fc3.weight is not "
                                        "decoder.embed_tokens.weight")
        if "decoder.fc3.bias" in state:
            state["decoder.output_bias"] = state.pop("decoder.fc3.bias")
    return state


def fconv_translation_model(args: dict, state: dict[str, torch.Tensor], path: Path) -> FConvSeq2Seq:
    """The model that fairseq's model arguments `args` (a plain dict of the parsed arguments) and the checkpoint's
    `model` state dict describe, in float32 on the CPU, in eval mode; CheckpointError (naming `path`) where they do
    not describe one or disagree."""
    arch = args.get("arch", args.get("_name")) or "fconv"  # newer fairseq's cfg names the architecture `_name`
    defaults = ARCHITECTURE_DEFAULTS.get(arch)
    if defaults is None:
        raise CheckpointError(path, f"fairseq architecture {arch!r}: Quill reads the fconv translation models here "
                                    f"({', '.join(ARCHITECTURE_DEFAULTS)})")
    if args.get("adaptive_softmax_cutoff") is not None:
        raise CheckpointError(path, f"adaptive_softmax_cutoff {args['adaptive_softmax_cutoff']!r}: fairseq's fconv "
                                    "translation models have fc2 and fc3, and Quill reads only those")
    encoder_layers = _layers(args, defaults, "encoder_layers", path)
    decoder_layers = _layers(args, defaults, "decoder_layers", path)
    attention = _attention(args, defaults, len(decoder_layers), path)
    share = bool(_field(args, defaults, "share_input_output_embed", path))
    state = _plain_state(state, path)
    encoder_width = _check_width(state, "encoder.embed_tokens.weight", args, "encoder_embed_dim",
                                 defaults["encoder_embed_dim"], path)
    decoder_width = _check_width(state, "decoder.embed_tokens.weight", args, "decoder_embed_dim",
                                 defaults["decoder_embed_dim"], path)
    for stack, layers in zip(STACKS, (encoder_layers, decoder_layers)):
        _check_convolutions(state, stack, layers, str(_given(args, defaults, f"{stack}_layers")), path)
    spec = str(_given(args, defaults, "decoder_attention"))
    _check_attention(state, attention, spec, path)
    try:
        config = FConvSeq2SeqConfig(
            vocab_size=state["decoder.embed_tokens.weight"].shape[0],
            source_vocab_size=state["encoder.embed_tokens.weight"].shape[0],
            encoder_embed_dim=encoder_width, decoder_embed_dim=decoder_width,
            encoder_layers=encoder_layers, decoder_layers=decoder_layers, decoder_attention=attention,
            out_embed_dim=_given(args, defaults, "decoder_out_embed_dim"),
            share_input_output_embed=share,
            max_source_len=_positions(state, "encoder", args, "max_source_positions", encoder_width, PAD, path),
            max_seq_len=_positions(state, "decoder", args, "max_target_positions", decoder_width, PAD, path),
            pad_token_id=PAD, extra={"fairseq_arch": arch},
        )
    except ValueError as e:
        raise CheckpointError(path, str(e)) from None
    state = _convert(state, config, path)
    with torch.device("meta"):
        model = FConvSeq2Seq(config)
    what = (f"encoder_layers {config.encoder_layers}, decoder_layers {config.decoder_layers}, decoder_attention "
            f"{spec}, decoder_out_embed_dim {config.out_embed_dim}, share_input_output_embed {share}")
    load_weights(model, state, path, what, assign=True)
    return model.eval().requires_grad_(False)
