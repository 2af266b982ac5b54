"""fairseq's translation checkpoints as its hub archives and training runs leave them: `model.pt` (or
`checkpoint_best.pt`; `model1.pt` of an ensemble) beside `dict.<src>.txt`, `dict.<tgt>.txt` and the BPE codes
(`bpecodes`, subword-nmt's or fastBPE's). Architectures: the convolutional models of Gehring et al. 2017 (`fconv`,
`fconv_wmt_en_de`, `fconv_wmt_en_fr`, ...; quill/models/classic/fairseq_fconv_mt.py) and the Transformers
(`transformer`, `transformer_wmt_en_de`, `transformer_vaswani_wmt_en_de_big`, the WMT'19 models, ...), which become
Quill's encoder-decoder Transformer in fairseq's layout (the same tensors transformers' FSMT port names).

The pickle is read through the allow-list (an argparse Namespace and plain containers, nothing else); the text
rules are fairseq's `moses` tokenizer and `subword_nmt` BPE, each dictionary numbered as fairseq's Dictionary
numbers it (fairseq_dictionary.py); sources end with </s>, and decoding starts from </s> too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from quill.models.families.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from quill.models.loading import hf
from quill.models.loading.errors import CheckpointError

from .fairseq_dictionary import EOS, PAD, SPECIALS, UNK, pad_dictionary, read_dictionary
from .fairseq_fconv import model_args
from .fairseq_fconv_mt import fconv_translation_model
from .formats import ClassicFormat, Converted, find_model_file, load_weights
from .restricted_pickle import attributes, load_restricted, peek_pickle

MODEL_NAMES = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt", "model1.pt")
CODES_NAMES = ("bpecodes", "code", "codes", "bpe.codes")
ALLOWED_CLASSES = ("argparse.Namespace",)
# The Transformer architectures' heads and norm placement where a checkpoint's arguments leave them out
BIG = {"encoder_attention_heads": 16, "decoder_attention_heads": 16}
ARCH_DEFAULTS = {
    "transformer_vaswani_wmt_en_de_big": BIG, "transformer_vaswani_wmt_en_fr_big": BIG,
    "transformer_wmt_en_de_big": BIG, "transformer_wmt_en_de_big_t2t": {
        **BIG, "encoder_normalize_before": True, "decoder_normalize_before": True},
    "transformer_iwslt_de_en": {"encoder_attention_heads": 4, "decoder_attention_heads": 4},
}
TRANSFORMER_DEFAULTS = {"encoder_attention_heads": 8, "decoder_attention_heads": 8, "activation_fn": "relu",
                        "max_source_positions": 1024, "max_target_positions": 1024}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_tanh", "swish": "silu"}


def _dictionaries(directory: Path) -> dict[str, Path]:
    """Language -> its dict.<lang>.txt in `directory`."""
    return {p.name[len("dict."):-len(".txt")]: p for p in sorted(directory.glob("dict.*.txt"))}


def _files(path: Path) -> tuple[Path | None, dict[str, Path]]:
    model = find_model_file(path, MODEL_NAMES, (".pt",))
    return model, _dictionaries(model.parent) if model is not None else {}


def detect(path: Path) -> bool:
    model, dicts = _files(path)
    if model is None or len(dicts) < 2:
        return False
    head = peek_pickle(model)
    return b"source_lang" in head and (b"fconv" in head or b"transformer" in head)


def inputs(path: Path, vocab: Path | None) -> list[Path]:
    model, dicts = _files(path)
    codes = [model.parent / n for n in CODES_NAMES if (model.parent / n).is_file()]
    return [model, *dicts.values(), *codes[:1]]


def _languages(checkpoint: dict, args: dict, dicts: dict[str, Path], path: Path) -> tuple[str, str]:
    task = checkpoint.get("cfg", {}).get("task") if isinstance(checkpoint.get("cfg"), dict) else None
    task = attributes(task) if task is not None else {}
    source = args.get("source_lang") or task.get("source_lang")
    target = args.get("target_lang") or task.get("target_lang")
    if not (source and target):
        raise CheckpointError(path, "the arguments name no source_lang and target_lang")
    for lang in (source, target):
        if lang not in dicts:
            raise CheckpointError(path.parent / f"dict.{lang}.txt", "missing: the model's dictionary for this language")
    return str(source), str(target)


def _state(checkpoint: dict, path: Path) -> dict[str, torch.Tensor]:
    state = checkpoint.get("model")
    if not isinstance(state, dict):
        raise CheckpointError(path, "no `model` state dict")
    not_tensors = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(path, f"state dict entries that are not tensors: {', '.join(not_tensors[:5])}")
    return dict(state)


def _layer_count(state: dict, stack: str) -> int:
    return len({k.split(".")[2] for k in state if k.startswith(f"{stack}.layers.")})


def _transformer(args: dict, state: dict, arch: str, path: Path) -> Seq2SeqTransformer:
    args = {**TRANSFORMER_DEFAULTS, **ARCH_DEFAULTS.get(arch, {}), **{k: v for k, v in args.items() if v is not None}}
    for key in [k for k in state if k.endswith((".version", "._float_tensor"))]:
        del state[key]
    if "decoder.embed_out" in state:  # fairseq before 0.10 named the unshared output layer so
        state["decoder.output_projection.weight"] = state.pop("decoder.embed_out")
    unsupported = [name for name in ("cross_self_attention", "layernorm_embedding", "no_token_positional_embeddings",
                                     "adaptive_softmax_cutoff", "quant_noise_pq") if args.get(name)]
    if unsupported:
        raise CheckpointError(path, f"fairseq Transformer option(s) Quill does not read: {', '.join(unsupported)}")
    if bool(args.get("encoder_normalize_before")) != bool(args.get("decoder_normalize_before")):
        raise CheckpointError(path, "encoder_normalize_before and decoder_normalize_before differ: Quill's layers "
                                    "put their norms in one place for both stacks")
    if args["encoder_attention_heads"] != args["decoder_attention_heads"]:
        raise CheckpointError(path, "encoder and decoder with different numbers of attention heads")
    if bool(args.get("encoder_learned_pos")) != bool(args.get("decoder_learned_pos")):
        raise CheckpointError(path, "learned positions on one side and sinusoids on the other")
    activation = ACTIVATIONS.get(args["activation_fn"])
    if activation is None:
        raise CheckpointError(path, f"activation_fn {args['activation_fn']!r} (Quill reads: {', '.join(ACTIVATIONS)})")
    try:
        target_vocab, d_model = state["decoder.embed_tokens.weight"].shape
        source_vocab = state["encoder.embed_tokens.weight"].shape[0]
        encoder_ffn = state["encoder.layers.0.fc1.weight"].shape[0]
        decoder_ffn = state["decoder.layers.0.fc1.weight"].shape[0]
    except KeyError as e:
        raise CheckpointError(path, f"no tensor {e}: not a fairseq Transformer") from None
    shared = bool(args.get("share_all_embeddings"))
    pre_norm = bool(args.get("encoder_normalize_before"))
    config = Seq2SeqConfig(
        vocab_size=target_vocab, d_model=d_model, encoder_layers=_layer_count(state, "encoder"),
        decoder_layers=_layer_count(state, "decoder"), n_heads=int(args["encoder_attention_heads"]),
        encoder_ffn=encoder_ffn, decoder_ffn=decoder_ffn, max_source_len=int(args["max_source_positions"]),
        max_seq_len=int(args["max_target_positions"]), activation=activation, pre_norm=pre_norm, final_norm=pre_norm,
        positional="learned" if args.get("encoder_learned_pos") else "sinusoidal_fairseq",
        position_offset=SPECIALS.index(PAD) + 1, embed_scale=1.0 if args.get("no_scale_embedding") else d_model ** 0.5,
        source_vocab_size=None if shared else source_vocab,
        tie_output=bool(args.get("share_decoder_input_output_embed") or shared),
        decoder_start_token_id=SPECIALS.index(EOS), pad_token_id=SPECIALS.index(PAD),
        extra={"fairseq_arch": arch},
    )
    with torch.device("meta"):
        model = Seq2SeqTransformer(config)
    # fairseq's names are those transformers' FSMT port keeps (without its "model." prefix): read them by its table
    table = replace(config, extra={"hf_model_type": "fsmt"})
    params = [name for name, _ in model.named_parameters()]
    weights = {}
    for source in hf.tensor_sources(table, params, set(state)):
        missing = [name for name in source.sources if name not in state]
        if missing:
            raise CheckpointError(path, f"no tensor {missing[0]} (for {source.name}): not a fairseq Transformer of "
                                        f"{config.encoder_layers}+{config.decoder_layers} layers")
        weights[source.name] = source.combine([state.pop(name) for name in source.sources])
    if shared:
        state.pop("encoder.embed_tokens.weight", None)
    if config.tie_output:
        state.pop("decoder.output_projection.weight", None)
    if state:
        raise CheckpointError(path, f"tensors Quill would leave unread: {', '.join(sorted(state)[:5])}")
    load_weights(model, weights, path, f"fairseq {arch}", assign=True)
    return model


def convert(path: Path, vocab: Path | None) -> Converted:
    model_file, dicts = _files(path)
    if model_file is None:
        raise CheckpointError(path, f"no model file ({', '.join(MODEL_NAMES)})")
    checkpoint = load_restricted(model_file, ALLOWED_CLASSES)
    if not isinstance(checkpoint, dict):
        raise CheckpointError(model_file, f"holds a {type(checkpoint).__name__}, not a fairseq checkpoint dict")
    args = model_args(checkpoint, model_file)
    arch = str(args.get("arch") or args.get("_name") or "")
    source_lang, target_lang = _languages(checkpoint, args, dicts, model_file)
    state = _state(checkpoint, model_file)
    if arch.startswith("fconv") and not arch.startswith("fconv_lm"):
        model, architecture = fconv_translation_model(args, state, model_file), "fconv_seq2seq"
    elif arch.startswith("transformer") and not arch.startswith("transformer_lm"):
        model, architecture = _transformer(args, state, arch, model_file), "seq2seq"
    else:
        raise CheckpointError(model_file, f"fairseq architecture {arch!r}: Quill reads fconv* and transformer* "
                                          "translation models here")
    model.eval().requires_grad_(False)
    config = model.config
    source_words = pad_dictionary(read_dictionary(dicts[source_lang]), _source_rows(model), dicts[source_lang])
    target_words = pad_dictionary(read_dictionary(dicts[target_lang]), config.vocab_size, dicts[target_lang])
    codes = next((model_file.parent / n for n in CODES_NAMES if (model_file.parent / n).is_file()), None)
    if codes is None and any(w.endswith("@@") for w in target_words[:2000]):
        raise CheckpointError(model_file.parent / CODES_NAMES[0], "missing: the dictionaries hold BPE pieces "
                                                                  "(\"@@\"), so the BPE codes must sit beside them")
    tokenizer = args.get("tokenizer")
    if tokenizer not in (None, "moses", "space"):
        raise CheckpointError(model_file, f"tokenizer {tokenizer!r}: Quill applies fairseq's moses tokenizer (or none)")
    spec = {"toolkit": "fairseq", "source_vocab": source_words, "target_vocab": target_words,
            "specials": {"unk": UNK, "pad": PAD, "bos": SPECIALS[0], "eos": EOS}, "source_suffix": [EOS],
            "languages": [source_lang, target_lang], "moses": tokenizer != "space", "lowercase": False,
            "bpe_codes": str(codes) if codes is not None else None, "sentencepiece": None}
    metadata = {"fairseq_arch": arch, "languages": [source_lang, target_lang]}
    # fairseq's SequenceGenerator sets pad's log-probability to -inf at every step
    return Converted(architecture, model, None, metadata, seq2seq_tokenizer=spec, never_generated=("pad",))


def _source_rows(model) -> int:
    """The encoder's vocabulary size: its own embedding's rows, or the shared one's."""
    embed = getattr(model, "src_embed", None) or getattr(model, "source_embed", None)
    if isinstance(embed, torch.nn.Embedding):
        return embed.num_embeddings
    return model.config.source_vocab_size or model.config.vocab_size


FORMAT = ClassicFormat("fairseq_translation", detect, convert, inputs)
FORMATS = [FORMAT]
