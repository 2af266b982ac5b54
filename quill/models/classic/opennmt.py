"""OpenNMT-py's recurrent translation models (onmt_train's `.pt` checkpoints, v1 to v3): an LSTM or GRU encoder,
bidirectional for "brnn", and a decoder with global attention, with or without input feeding
(quill/models/families/rnn_seq2seq.py), read without OpenNMT or torchtext installed.

The architecture is read from the training options (`opt`, with OpenNMT's precedence: `layers`, `rnn_size` or
`hidden_size`, and `word_vec_size` override the per-side values) and checked against the state dict: every size,
the cell, the directions, input feeding, the attention and the bridge, a mismatch named. What the model does not
run is refused by name: Transformer and CNN encoders, copy attention, context gates, word features, position
encodings, sparsemax. Coverage attention trains a weight (`linear_cover`) that no inference step reads (OpenNMT's
decoder never passes coverage to its attention): it is dropped. The vocabularies (opennmt_vocab.py) must match the
embeddings row for row.

The text rules (the vocabularies, the subword model the options name) are described by opennmt_text.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quill.models.families.rnn_seq2seq import RNN_TYPES, RNNSeq2Seq, RNNSeq2SeqConfig
from quill.models.loading.errors import CheckpointError

from .formats import ClassicFormat, Converted, find_model_file, load_weights
from .opennmt_text import text_rules
from .opennmt_vocab import load_checkpoint_dict, read_vocabularies
from .restricted_pickle import attributes, peek_pickle

SRC_EMBED, TGT_EMBED = "encoder.embeddings.make_embedding.emb_luts.0.weight", \
    "decoder.embeddings.make_embedding.emb_luts.0.weight"
RENAMES = (  # OpenNMT's state-dict prefixes -> Quill's, the first that matches
    ("encoder.embeddings.make_embedding.emb_luts.0.", "src_embed."),
    ("decoder.embeddings.make_embedding.emb_luts.0.", "tgt_embed."),
    ("encoder.rnn.", "encoder."),
    ("encoder.bridge.", "bridge."),
    ("decoder.rnn.layers.", "decoder."),  # with input feeding: a cell per layer
    ("decoder.rnn.", "decoder."),
    ("decoder.attn.", "attn."),
)
COVERAGE = "decoder.attn.linear_cover.weight"
# Sizes as OpenNMT applies them: a positive shared value overrides both sides' (v1/v2 say rnn_size, v3 hidden_size)
SHARED_SIZES = (("word_vec_size", "src_word_vec_size", "tgt_word_vec_size"), ("layers", "enc_layers", "dec_layers"),
                ("rnn_size", "enc_rnn_size", "dec_rnn_size"), ("hidden_size", "enc_hid_size", "dec_hid_size"))
EVIDENCE = {  # the tensors that say what the state dict says of each option
    "rnn_type": "encoder.rnn.weight_hh_l0: gates per unit", "brnn": "encoder.rnn.*_reverse",
    "input_feed": "decoder.rnn.layers.* cells, or decoder.rnn.*_l0", "global_attention": "decoder.attn.*",
    "bridge": "encoder.bridge.*", "enc_layers": "encoder.rnn.weight_hh_l*", "dec_layers": "decoder.rnn.*weight_hh*",
    "enc_hid_size": "encoder.rnn.weight_hh_l0", "dec_hid_size": "decoder.rnn.*weight_hh*",
    "src_word_vec_size": SRC_EMBED, "tgt_word_vec_size": TGT_EMBED,
}
KEPT_OPTIONS = ("encoder_type", "decoder_type", "rnn_type", "global_attention", "input_feed", "bridge",
                "share_decoder_embeddings", "share_embeddings", "coverage_attn", "src_seq_length", "tgt_seq_length")


def _model_file(path: Path) -> Path | None:
    return find_model_file(path, (), (".pt",))


def detect(path: Path) -> bool:
    file = _model_file(path)
    # the state dict's names are spelled in the pickle: OpenNMT's embeddings, and the generator kept apart
    return file is not None and b"make_embedding.emb_luts" in (data := peek_pickle(file)) and b"generator" in data


def _plain(value):
    """An option's value as JSON holds it."""
    if isinstance(value, (set, tuple, list)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def _options(opt, path: Path) -> dict:
    try:
        options = dict(attributes(opt))
    except TypeError:
        raise CheckpointError(path, f"opt is a {type(opt).__name__}, not a record of options") from None
    for shared, *sides in SHARED_SIZES:
        if isinstance(options.get(shared), int) and options[shared] > 0:
            options.update(dict.fromkeys(sides, options[shared]))
    for side in ("enc", "dec"):
        options.setdefault(f"{side}_hid_size", options.get(f"{side}_rnn_size"))
    return options


def _refuse_unsupported(options: dict, path: Path) -> None:
    attention = options.get("global_attention", "general")
    problems = [
        (options.get("model_type", "text") != "text", f"model_type {options.get('model_type')!r}: Quill reads text "
                                                      "models"),
        (options.get("model_task", "seq2seq") != "seq2seq", f"model_task {options.get('model_task')!r}: a language "
                                                            "model, not an encoder-decoder"),
        (options.get("encoder_type", "rnn") not in ("rnn", "brnn") or options.get("decoder_type", "rnn") != "rnn",
         f"encoder_type {options.get('encoder_type')!r}, decoder_type {options.get('decoder_type')!r}: Quill "
         "reads OpenNMT-py's recurrent models here (encoder rnn or brnn, decoder rnn)"),
        (options.get("rnn_type", "LSTM") not in RNN_TYPES, f"rnn_type {options.get('rnn_type')!r}: Quill runs "
                                                           f"{' and '.join(RNN_TYPES)}"),
        (bool(options.get("copy_attn")), "copy_attn: the copy generator is not supported"),
        (bool(options.get("context_gate")), f"context_gate {options.get('context_gate')!r}: not supported"),
        (attention not in (None, "dot", "general", "mlp", "none"), f"global_attention {attention!r}: unknown"),
    ]
    for refused, message in problems:
        if refused:
            raise CheckpointError(path, message)


def _count(state: dict, pattern: str) -> int:
    n = 0
    while pattern.format(n) in state:
        n += 1
    return n


def _architecture(state: dict, path: Path) -> dict:
    """What the state dict's names and shapes say of the model."""
    for key in (SRC_EMBED, TGT_EMBED, "encoder.rnn.weight_hh_l0"):
        if key not in state:
            raise CheckpointError(path, f"no {key}: not an OpenNMT-py recurrent encoder-decoder")
    fed = "decoder.rnn.layers.0.weight_hh" in state
    decoder_hh = state.get("decoder.rnn.layers.0.weight_hh" if fed else "decoder.rnn.weight_hh_l0")
    if decoder_hh is None:
        raise CheckpointError(path, "no decoder.rnn weights: not an OpenNMT-py recurrent decoder")
    encoder_hh = state["encoder.rnn.weight_hh_l0"]
    gates = encoder_hh.shape[0] // encoder_hh.shape[1]
    directions = 2 if "encoder.rnn.weight_hh_l0_reverse" in state else 1
    attention = next((kind for kind, key in (("general", "linear_in"), ("mlp", "linear_query"), ("dot", "linear_out"))
                      if f"decoder.attn.{key}.weight" in state), "none")
    return {
        "rnn_type": {4: "LSTM", 3: "GRU"}.get(gates, f"a cell of {gates} gates"),
        "brnn": directions == 2, "input_feed": fed, "global_attention": attention,
        "bridge": "encoder.bridge.0.weight" in state,
        "enc_layers": _count(state, "encoder.rnn.weight_hh_l{}"),
        "dec_layers": _count(state, "decoder.rnn.layers.{}.weight_hh" if fed else "decoder.rnn.weight_hh_l{}"),
        "enc_hid_size": encoder_hh.shape[1] * directions, "dec_hid_size": decoder_hh.shape[1],
        "src_word_vec_size": state[SRC_EMBED].shape[1], "tgt_word_vec_size": state[TGT_EMBED].shape[1],
    }


def _declared(options: dict) -> dict:
    """What the options say of the same, where they say it."""
    sizes = {name: options.get(name) for name in ("enc_layers", "dec_layers", "enc_hid_size", "dec_hid_size",
                                                  "src_word_vec_size", "tgt_word_vec_size")}
    attention = options.get("global_attention", "general")
    return {
        "rnn_type": options.get("rnn_type", "LSTM"),
        "brnn": options.get("encoder_type", "rnn") == "brnn" or options.get("brnn") is True,
        "input_feed": bool(options.get("input_feed", 1)), "global_attention": attention or "none",
        "bridge": bool(options.get("bridge")),
        **{name: value for name, value in sizes.items() if isinstance(value, int) and value > 0},
    }


def _check_architecture(declared: dict, found: dict, path: Path) -> None:
    for name, value in declared.items():
        if found[name] != value:
            raise CheckpointError(path, f"opt says {name} {value!r}, but the state dict says {found[name]!r} "
                                        f"({EVIDENCE[name]})")
    for a, b in (("enc_layers", "dec_layers"), ("enc_hid_size", "dec_hid_size")):
        if found[a] != found[b]:
            raise CheckpointError(path, f"{a} {found[a]} and {b} {found[b]} differ: the decoder starts from the "
                                        "encoder's last states, so Quill needs them equal")


def _weights(checkpoint: dict, config: RNNSeq2SeqConfig, path: Path) -> tuple[dict, list[str]]:
    """The state dict by Quill's names, and the names of what was dropped."""
    model, generator = checkpoint["model"], checkpoint["generator"]
    state, dropped = {}, []
    for key, tensor in model.items():
        if key == COVERAGE:
            dropped.append(key)
            continue
        new = next((to + key[len(prefix):] for prefix, to in RENAMES if key.startswith(prefix)), key)
        state[new] = tensor
    # v1, v2 and v3.0 save the generator as Sequential(Linear, Cast, LogSoftmax), later v3 as the Linear alone
    generator = {key.removeprefix("0."): tensor for key, tensor in generator.items()}
    weight, bias = generator.pop("weight", None), generator.pop("bias", None)
    if generator or bias is None:
        raise CheckpointError(path, f"the generator holds {', '.join(checkpoint['generator'])}: OpenNMT-py's is a "
                                    "linear layer with a bias")
    state["generator_bias"] = bias
    if not config.share_decoder_embeddings:
        state["generator.weight"] = weight
    elif weight is not None and not torch.equal(weight, state["tgt_embed.weight"]):
        raise CheckpointError(path, "opt says share_decoder_embeddings, but the generator's weight differs from "
                                    f"{TGT_EMBED}")
    return state, dropped


def _check_vocabularies(vocabularies: dict, state: dict, path: Path) -> None:
    for side, key, what in (("source", SRC_EMBED, "encoder"), ("target", TGT_EMBED, "decoder")):
        rows, tokens = state[key].shape[0], len(vocabularies[side])
        if rows != tokens:
            raise CheckpointError(path, f"the {side} vocabulary has {tokens} tokens, but the {what}'s embeddings "
                                        f"({key}) have {rows} rows")


def convert(path: Path, vocab: Path | None) -> Converted:
    model_file = _model_file(path)
    if model_file is None:
        raise CheckpointError(path, "no OpenNMT-py .pt file (a directory must hold exactly one)")
    if vocab is not None:
        raise CheckpointError(vocab, "OpenNMT-py keeps its vocabularies in the checkpoint: no other is read")
    checkpoint = load_checkpoint_dict(model_file)
    for name in ("model", "generator"):
        part = checkpoint[name]
        if not isinstance(part, dict) or not all(isinstance(t, torch.Tensor) for t in part.values()):
            raise CheckpointError(model_file, f"`{name}` is not a state dict of tensors")
    options = _options(checkpoint["opt"], model_file)
    _refuse_unsupported(options, model_file)
    if options.get("generator_function", "softmax") != "softmax" and any(
            key.startswith("0.") for key in checkpoint["generator"]):
        raise CheckpointError(model_file, f"generator_function {options['generator_function']!r}: Quill's "
                                          "generator is a log-softmax")
    state = checkpoint["model"]
    found = _architecture(state, model_file)
    _check_architecture(_declared(options), found, model_file)
    vocabularies = read_vocabularies(checkpoint["vocab"], model_file)
    _check_vocabularies(vocabularies, state, model_file)
    specials, target = vocabularies["specials"], vocabularies["target"]
    try:
        config = RNNSeq2SeqConfig(
            vocab_size=len(target), source_vocab_size=len(vocabularies["source"]), hidden_size=found["dec_hid_size"],
            layers=found["dec_layers"], source_embed_dim=found["src_word_vec_size"],
            target_embed_dim=found["tgt_word_vec_size"], rnn_type=found["rnn_type"], bidirectional=found["brnn"],
            bridge=found["bridge"], global_attention=found["global_attention"],
            global_attention_function=options.get("global_attention_function", "softmax"),
            input_feed=found["input_feed"], share_decoder_embeddings=bool(options.get("share_decoder_embeddings")),
            position_encoding=bool(options.get("position_encoding")),
            decoder_start_token_id=target.index(specials["bos"]),
            pad_token_id=target.index(specials["pad"]) if specials["pad"] in target else None,
            extra={"opennmt_vocab_form": vocabularies["form"]})
    except ValueError as e:
        raise CheckpointError(model_file, str(e)) from None
    weights, dropped = _weights(checkpoint, config, model_file)
    with torch.device("meta"):
        model = RNNSeq2Seq(config)
    load_weights(model, weights, model_file, f"the architecture its opt describes ({found})", assign=True)
    model.eval().requires_grad_(False)
    spec = text_rules(options, vocabularies, model_file)
    metadata = {"opennmt_vocab_form": vocabularies["form"],
                "opennmt_options": {name: _plain(options[name]) for name in KEPT_OPTIONS if name in options}}
    if dropped:
        metadata["dropped_tensors"] = dropped
    return Converted("rnn_seq2seq", model, None, metadata, seq2seq_tokenizer=spec)


FORMAT = ClassicFormat("opennmt", detect, convert)
FORMATS = [FORMAT]
