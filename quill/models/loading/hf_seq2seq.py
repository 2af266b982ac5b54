"""The Hugging Face encoder-decoder families (Marian, BART, mBART, M2M100/NLLB, FSMT, T5/mT5/umT5): how each config.json
maps onto `Seq2SeqConfig`, and the table of checkpoint tensors each of our parameters is made of (q, k, v fused into
one matmul; the cross-attention's k, v into another, run once per request on the encoder's output).

A name "a|b" in the table is the first of a and b the checkpoint holds: tied embeddings are saved once, under
whichever name the saving version of transformers picked.
"""

from __future__ import annotations

from ..families.seq2seq import Seq2SeqConfig
from .hf_families import Family, fused, one

ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}


def _activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation_function {name!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def _common(raw: dict, **switches) -> Seq2SeqConfig:
    heads = raw["encoder_attention_heads"]
    if raw["decoder_attention_heads"] != heads:
        raise ValueError("encoder and decoder with different numbers of attention heads are not supported")
    scale = raw["d_model"] ** 0.5 if raw.get("scale_embedding") else 1.0
    fields = dict(
        vocab_size=raw["vocab_size"], d_model=raw["d_model"], encoder_layers=raw["encoder_layers"],
        decoder_layers=raw["decoder_layers"], n_heads=heads, encoder_ffn=raw["encoder_ffn_dim"],
        decoder_ffn=raw["decoder_ffn_dim"], max_source_len=raw["max_position_embeddings"],
        max_seq_len=raw["max_position_embeddings"], activation=_activation(raw["activation_function"]),
        embed_scale=scale, tie_output=raw.get("tie_word_embeddings", True),
        decoder_start_token_id=raw["decoder_start_token_id"], pad_token_id=raw.get("pad_token_id"),
        forced_bos_token_id=raw.get("forced_bos_token_id"),
        extra={"hf_model_type": raw["model_type"]},
    )
    return Seq2SeqConfig(**{**fields, **switches})


def _marian(raw: dict) -> Seq2SeqConfig:
    separate = not raw.get("share_encoder_decoder_embeddings", True)
    changes = {"vocab_size": raw["decoder_vocab_size"] or raw["vocab_size"], "source_vocab_size": raw["vocab_size"]}
    return _common(raw, positional="sinusoidal", output_bias=True, **(changes if separate else {}))


def _bart(raw: dict) -> Seq2SeqConfig:
    return _common(raw, positional="learned", position_offset=2, embed_norm=True, output_bias=True)


def _mbart(raw: dict) -> Seq2SeqConfig:
    return _common(raw, positional="learned", position_offset=2, embed_norm=True, output_bias=True, pre_norm=True,
                   final_norm=True)


def _m2m100(raw: dict) -> Seq2SeqConfig:
    return _common(raw, positional="sinusoidal_fairseq", position_offset=raw["pad_token_id"] + 1, pre_norm=True,
                   final_norm=True)


def _fsmt(raw: dict) -> Seq2SeqConfig:
    """fairseq's WMT19 Transformers as transformers ports them: post-norm, fairseq's sinusoids, a vocabulary for
    each side, the output layer its own tensor."""
    raw = {**raw, "vocab_size": raw["tgt_vocab_size"]}
    return _common(raw, positional="sinusoidal_fairseq", position_offset=raw["pad_token_id"] + 1,
                   source_vocab_size=raw["src_vocab_size"])


def _attention(ours: str, theirs: str) -> dict:
    return {f"{ours}.qkv.{{w}}": fused(*(f"{theirs}.{x}_proj.{{w}}" for x in "qkv")),
            f"{ours}.out.{{w}}": one(f"{theirs}.out_proj.{{w}}")}


_ENC, _DEC = "encoder.layers.{i}", "{p}encoder.layers.{i}"
_DEC_OURS, _DEC_THEIRS = "decoder.layers.{i}", "{p}decoder.layers.{i}"
SEQ2SEQ_TENSORS = {
    "embed.weight": one("{p}shared.weight|{p}decoder.embed_tokens.weight"),
    "src_embed.weight": one("{p}encoder.embed_tokens.weight"),
    "lm_head.weight": one("lm_head.weight|{p}decoder.output_projection.weight"),
    "lm_bias": one("final_logits_bias"),
    **{f"{stack}.{ours}.{{w}}": one(f"{{p}}{stack}.{theirs}.{{w}}") for stack in ("encoder", "decoder")
       for ours, theirs in (("pos_embed", "embed_positions"), ("embed_norm", "layernorm_embedding"),
                            ("final_norm", "layer_norm"))},
    **_attention(_ENC, _DEC + ".self_attn"),
    f"{_ENC}.attn_norm.{{w}}": one(f"{_DEC}.self_attn_layer_norm.{{w}}"),
    f"{_ENC}.mlp_norm.{{w}}": one(f"{_DEC}.final_layer_norm.{{w}}"),
    f"{_ENC}.mlp.fc1.{{w}}": one(f"{_DEC}.fc1.{{w}}"),
    f"{_ENC}.mlp.fc2.{{w}}": one(f"{_DEC}.fc2.{{w}}"),
    **_attention(_DEC_OURS, _DEC_THEIRS + ".self_attn"),
    f"{_DEC_OURS}.attn_norm.{{w}}": one(f"{_DEC_THEIRS}.self_attn_layer_norm.{{w}}"),
    f"{_DEC_OURS}.cross_q.{{w}}": one(f"{_DEC_THEIRS}.encoder_attn.q_proj.{{w}}"),
    f"{_DEC_OURS}.cross_kv.{{w}}": fused(f"{_DEC_THEIRS}.encoder_attn.k_proj.{{w}}",
                                         f"{_DEC_THEIRS}.encoder_attn.v_proj.{{w}}"),
    f"{_DEC_OURS}.cross_out.{{w}}": one(f"{_DEC_THEIRS}.encoder_attn.out_proj.{{w}}"),
    f"{_DEC_OURS}.cross_norm.{{w}}": one(f"{_DEC_THEIRS}.encoder_attn_layer_norm.{{w}}"),
    f"{_DEC_OURS}.mlp_norm.{{w}}": one(f"{_DEC_THEIRS}.final_layer_norm.{{w}}"),
    f"{_DEC_OURS}.mlp.fc1.{{w}}": one(f"{_DEC_THEIRS}.fc1.{{w}}"),
    f"{_DEC_OURS}.mlp.fc2.{{w}}": one(f"{_DEC_THEIRS}.fc2.{{w}}"),
}

def _t5(raw: dict) -> Seq2SeqConfig:
    """T5, mT5 and umT5: relative-position bias (umT5: a table in every layer), RMS norms, no biases, relu or gated
    feed-forward (feed_forward_proj)."""
    gated, _, act = raw["feed_forward_proj"].rpartition("-")
    activation = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}.get(act)
    if activation is None or gated not in ("", "gated"):
        raise ValueError(f"feed_forward_proj {raw['feed_forward_proj']!r} is not supported")
    tied = raw.get("tie_word_embeddings", True)
    # T5 and umT5 scale their last hidden state where the output layer is the embedding; mT5 never does (transformers
    # 5 ties mT5's and still does not scale). transformers 5 saves tie_word_embeddings true whatever the model was,
    # and what it meant for the scaling as scale_decoder_outputs.
    scaled = raw["model_type"] in ("t5", "umt5") and raw.get("scale_decoder_outputs", tied)
    length = raw.get("n_positions") or 512  # no positions to outgrow: the length T5 was trained on
    return Seq2SeqConfig(
        vocab_size=raw["vocab_size"], d_model=raw["d_model"], encoder_layers=raw["num_layers"],
        decoder_layers=raw.get("num_decoder_layers") or raw["num_layers"], n_heads=raw["num_heads"],
        encoder_ffn=raw["d_ff"], decoder_ffn=raw["d_ff"], max_source_len=length, max_seq_len=length,
        activation=activation, pre_norm=True, final_norm=True, positional="none", norm="rmsnorm",
        norm_eps=raw["layer_norm_epsilon"], linear_bias=False, head_size=raw["d_kv"], attn_scale=1.0,
        relative_buckets=raw["relative_attention_num_buckets"],
        relative_max_distance=raw["relative_attention_max_distance"], gated_ffn=gated == "gated",
        relative_bias_per_layer=raw["model_type"] == "umt5",
        output_scale=raw["d_model"] ** -0.5 if scaled else 1.0, tie_output=tied,
        decoder_start_token_id=raw["decoder_start_token_id"], pad_token_id=raw.get("pad_token_id"),
        extra={"hf_model_type": raw["model_type"]},
    )


def _t5_tensors(config: Seq2SeqConfig) -> dict:
    """T5's names: block i, layer 0 its self-attention, 1 the cross-attention (decoder), last the feed-forward; the
    bias table block 0's (T5, mT5) or every block's (umT5)."""
    ff = "wi_0.weight", "wi_1.weight"
    table = {"embed.weight": one("shared.weight|decoder.embed_tokens.weight"), "lm_head.weight": one("lm_head.weight")}
    for stack in ("encoder", "decoder"):
        ours, theirs = f"{stack}.layers.{{i}}", f"{stack}.block.{{i}}.layer"
        last = 2 if stack == "decoder" else 1
        table.update({
            f"{stack}.rel_bias.weight": one(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
            f"{ours}.rel_bias.weight": one(f"{theirs}.0.SelfAttention.relative_attention_bias.weight"),
            f"{stack}.final_norm.weight": one(f"{stack}.final_layer_norm.weight"),
            f"{ours}.qkv.weight": fused(*(f"{theirs}.0.SelfAttention.{x}.weight" for x in "qkv")),
            f"{ours}.out.weight": one(f"{theirs}.0.SelfAttention.o.weight"),
            f"{ours}.attn_norm.weight": one(f"{theirs}.0.layer_norm.weight"),
            f"{ours}.mlp_norm.weight": one(f"{theirs}.{last}.layer_norm.weight"),
            f"{ours}.mlp.fc1.weight": fused(*(f"{theirs}.{last}.DenseReluDense.{w}" for w in ff))
            if config.gated_ffn else one(f"{theirs}.{last}.DenseReluDense.wi.weight"),
            f"{ours}.mlp.fc2.weight": one(f"{theirs}.{last}.DenseReluDense.wo.weight"),
        })
    cross = "decoder.block.{i}.layer.1"
    table.update({
        "decoder.layers.{i}.cross_q.weight": one(f"{cross}.EncDecAttention.q.weight"),
        "decoder.layers.{i}.cross_kv.weight": fused(f"{cross}.EncDecAttention.k.weight",
                                                    f"{cross}.EncDecAttention.v.weight"),
        "decoder.layers.{i}.cross_out.weight": one(f"{cross}.EncDecAttention.o.weight"),
        "decoder.layers.{i}.cross_norm.weight": one(f"{cross}.layer_norm.weight"),
    })
    return table


_T5_DEFAULTS = {"feed_forward_proj": "relu", "layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32,
                "relative_attention_max_distance": 128, "decoder_start_token_id": 0, "pad_token_id": 0,
                "tie_word_embeddings": True, "d_kv": 64, "num_heads": 8}

_DEFAULTS = {"activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
             "pad_token_id": 1, "decoder_start_token_id": 2}
SEQ2SEQ_FAMILIES = {
    "marian": Family(_marian, SEQ2SEQ_TENSORS, architecture="seq2seq", defaults={
        **_DEFAULTS, "activation_function": "swish", "scale_embedding": True, "decoder_vocab_size": None,
        "share_encoder_decoder_embeddings": True, "pad_token_id": 58100, "decoder_start_token_id": 58100,
        "max_position_embeddings": 1024}),
    "bart": Family(_bart, SEQ2SEQ_TENSORS, architecture="seq2seq", defaults={
        **_DEFAULTS, "max_position_embeddings": 1024}),
    "mbart": Family(_mbart, SEQ2SEQ_TENSORS, architecture="seq2seq", defaults={
        **_DEFAULTS, "max_position_embeddings": 1024}),
    "fsmt": Family(_fsmt, SEQ2SEQ_TENSORS, architecture="seq2seq", defaults={
        **_DEFAULTS, "activation_function": "relu", "scale_embedding": True, "tie_word_embeddings": False,
        "max_position_embeddings": 1024}),
    "t5": Family(_t5, _t5_tensors, prefix="", architecture="seq2seq", defaults=_T5_DEFAULTS),
    "mt5": Family(_t5, _t5_tensors, prefix="", architecture="seq2seq", defaults={**_T5_DEFAULTS,
                                                                                 "tie_word_embeddings": False}),
    # UMT5Config's own defaults; tie_word_embeddings true as T5's (the hub's umT5 configs say false)
    "umt5": Family(_t5, _t5_tensors, prefix="", architecture="seq2seq", defaults={
        **_T5_DEFAULTS, "feed_forward_proj": "gated-gelu", "num_heads": 6, "vocab_size": 250112, "d_model": 512,
        "d_ff": 1024, "num_layers": 8}),
    "m2m_100": Family(_m2m100, SEQ2SEQ_TENSORS, architecture="seq2seq", defaults={
        **_DEFAULTS, "activation_function": "relu", "scale_embedding": True, "max_position_embeddings": 1024}),
}
