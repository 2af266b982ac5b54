"""The Hugging Face model families Quill serves, declared one entry each in `FAMILIES`.

A family says how its config.json maps onto `TransformerConfig` and, in a table, which
checkpoint tensors make each of our parameters. Table keys are our parameter names,
values the checkpoint names, as templates: `{i}` is the layer, `{w}` "weight" or "bias",
`{p}` the prefix of the base model ("model." in a ...ForCausalLM checkpoint, nothing in a
bare base model). Entries for parameters a configuration does not have (biases, q/k
norms, an untied lm_head) are simply never asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..families import lfm2, mamba
from ..families.mamba2 import read_config as read_mamba2_config
from ..families.transformer import TransformerConfig
from ..families.xlstm import HF_DEFAULTS as XLSTM_DEFAULTS
from ..families.xlstm import read_hf_config as _xlstm
from .rope_config import read_rope

log = logging.getLogger("quill.models")


@dataclass(frozen=True)
class Source:
    """The checkpoint tensors one of our parameters is made of."""

    names: tuple[str, ...]
    transpose: bool = False  # GPT-2's Conv1D stores (in, out)

    def combine(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        # Several tensors are stacked along the output dimension: [q; k; v] or [gate; up].
        tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
        return tensor.t() if self.transpose else tensor


def one(name: str) -> Source:
    return Source((name,))


def fused(*names: str) -> Source:
    return Source(names)


def transposed(name: str) -> Source:
    return Source((name,), transpose=True)


@dataclass(frozen=True)
class Family:
    read_config: Callable[[dict], object]  # config.json (with `defaults` filled in) -> our config of `architecture`
    # Our parameter name -> its checkpoint tensors (or a function of our config giving that table); None: our
    # modules carry the checkpoint's own names.
    tensors: dict[str, Source] | Callable[[object], dict[str, Source]] | None
    prefix: str = "model."
    # Values the family's transformers class assumes when config.json leaves a key out.
    defaults: dict = field(default_factory=dict)
    architecture: str = "transformer"  # a key of models.registry.ARCHITECTURES


# ---- tensor name tables ---------------------------------------------------------------

_H = "{p}h.{i}."
GPT2_TENSORS = {
    "embed.weight": one("{p}wte.weight"),
    "pos_embed.weight": one("{p}wpe.weight"),
    "norm.{w}": one("{p}ln_f.{w}"),
    "lm_head.weight": one("lm_head.weight"),
    "layers.{i}.attn_norm.{w}": one(_H + "ln_1.{w}"),
    "layers.{i}.mlp_norm.{w}": one(_H + "ln_2.{w}"),
    "layers.{i}.attn.qkv.weight": transposed(_H + "attn.c_attn.weight"),
    "layers.{i}.attn.qkv.bias": one(_H + "attn.c_attn.bias"),
    "layers.{i}.attn.out.weight": transposed(_H + "attn.c_proj.weight"),
    "layers.{i}.attn.out.bias": one(_H + "attn.c_proj.bias"),
    "layers.{i}.mlp.up.weight": transposed(_H + "mlp.c_fc.weight"),
    "layers.{i}.mlp.up.bias": one(_H + "mlp.c_fc.bias"),
    "layers.{i}.mlp.down.weight": transposed(_H + "mlp.c_proj.weight"),
    "layers.{i}.mlp.down.bias": one(_H + "mlp.c_proj.bias"),
}

_L = "{p}layers.{i}."
LLAMA_TENSORS = {
    "embed.weight": one("{p}embed_tokens.weight"),
    "norm.weight": one("{p}norm.weight"),
    "lm_head.weight": one("lm_head.weight"),
    "layers.{i}.attn_norm.weight": one(_L + "input_layernorm.weight"),
    "layers.{i}.mlp_norm.weight": one(_L + "post_attention_layernorm.weight"),
    "layers.{i}.attn.qkv.{w}": fused(
        _L + "self_attn.q_proj.{w}", _L + "self_attn.k_proj.{w}", _L + "self_attn.v_proj.{w}"
    ),
    "layers.{i}.attn.out.{w}": one(_L + "self_attn.o_proj.{w}"),
    "layers.{i}.mlp.up.{w}": fused(_L + "mlp.gate_proj.{w}", _L + "mlp.up_proj.{w}"),
    "layers.{i}.mlp.down.{w}": one(_L + "mlp.down_proj.{w}"),
}

QWEN3_TENSORS = {
    **LLAMA_TENSORS,
    "layers.{i}.attn.q_norm.weight": one(_L + "self_attn.q_norm.weight"),
    "layers.{i}.attn.k_norm.weight": one(_L + "self_attn.k_norm.weight"),
}

PHI3_TENSORS = {
    **LLAMA_TENSORS,
    # Stored fused already, in our order: [q; k; v] and [gate; up].
    "layers.{i}.attn.qkv.{w}": one(_L + "self_attn.qkv_proj.{w}"),
    "layers.{i}.mlp.up.{w}": one(_L + "mlp.gate_up_proj.{w}"),
}

# LFM2 (quill/models/families/lfm2.py): its conv layers and norms keep the checkpoint's names; its attention and feed-forward are
# the Transformer's modules, fused as Llama's.
LFM2_TENSORS = {
    "embed_tokens.weight": one("{p}embed_tokens.weight"),
    "embedding_norm.weight": one("{p}embedding_norm.weight"),
    "lm_head.weight": one("lm_head.weight"),
    **{f"layers.{{i}}.{name}": one(_L + name) for name in (
        "operator_norm.weight", "ffn_norm.weight", "conv.in_proj.{w}", "conv.conv.{w}", "conv.out_proj.{w}")},
    "layers.{i}.self_attn.qkv.weight": fused(
        _L + "self_attn.q_proj.weight", _L + "self_attn.k_proj.weight", _L + "self_attn.v_proj.weight"),
    "layers.{i}.self_attn.out.weight": one(_L + "self_attn.out_proj.weight"),
    "layers.{i}.self_attn.q_norm.weight": one(_L + "self_attn.q_layernorm.weight"),
    "layers.{i}.self_attn.k_norm.weight": one(_L + "self_attn.k_layernorm.weight"),
    "layers.{i}.feed_forward.up.weight": fused(_L + "feed_forward.w1.weight", _L + "feed_forward.w3.weight"),
    "layers.{i}.feed_forward.down.weight": one(_L + "feed_forward.w2.weight"),
}


# ---- config.json readers ----------------------------------------------------------------

# Hugging Face activation names -> ours.
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def _activation(name: str, table: dict = ACTIVATIONS) -> str:
    if name not in table:
        raise ValueError(f"unsupported activation {name!r} (supported: {', '.join(table)})")
    return table[name]


def _sliding_window(raw: dict) -> int | None:
    """The attention window of the checkpoint's sliding-window layers, or None if it has none."""
    window = raw.get("sliding_window")
    if window is None or raw.get("use_sliding_window") is False:
        return None
    layer_types = raw.get("layer_types")
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window


def _context(raw: dict) -> int:
    """The longest context served. Quill has no sliding-window attention; within the window it
    is exactly full attention (a query sees keys less than `window` positions back), so a
    checkpoint with a shorter window than max_position_embeddings is served with a context
    of the window, never with a longer one."""
    max_len = raw["max_position_embeddings"]
    window = _sliding_window(raw)
    if window is not None and window < max_len:
        log.warning("sliding window of %d tokens is shorter than max_position_embeddings %d: serving a context "
                    "of %d tokens (sliding-window attention is not implemented)", window, max_len, window)
        return window
    return max_len


def _gpt2(raw: dict) -> TransformerConfig:
    if raw.get("scale_attn_by_inverse_layer_idx") or raw.get("reorder_and_upcast_attn"):
        raise ValueError("GPT-2 variants with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported")
    return TransformerConfig(
        vocab_size=raw["vocab_size"], d_model=raw["n_embd"], n_layers=raw["n_layer"], n_heads=raw["n_head"],
        d_ff=raw.get("n_inner") or 4 * raw["n_embd"], max_seq_len=raw["n_positions"], positional="learned",
        norm="layernorm", norm_eps=raw["layer_norm_epsilon"], gated_mlp=False,
        activation=_activation(raw["activation_function"]), attn_bias=True, mlp_bias=True,
        tie_embeddings=raw["tie_word_embeddings"], extra={"hf_model_type": "gpt2"},
    )


def _llama(raw: dict, **changes) -> TransformerConfig:
    """Llama's config, with `changes` for a relative that departs from it."""
    theta, scaling = read_rope(raw)
    fields = dict(
        vocab_size=raw["vocab_size"], d_model=raw["hidden_size"], n_layers=raw["num_hidden_layers"],
        n_heads=raw["num_attention_heads"], n_kv_heads=raw.get("num_key_value_heads"), head_dim=raw.get("head_dim"),
        d_ff=raw["intermediate_size"], max_seq_len=_context(raw), positional="rope", norm="rmsnorm",
        norm_eps=raw["rms_norm_eps"], gated_mlp=True, activation=_activation(raw["hidden_act"]),
        attn_bias=raw.get("attention_bias", False), mlp_bias=raw.get("mlp_bias", False), rope_theta=theta,
        rope_scaling=scaling, tie_embeddings=raw["tie_word_embeddings"], extra={"hf_model_type": raw["model_type"]},
    )
    return TransformerConfig(**{**fields, **changes})


def _qwen2(raw: dict) -> TransformerConfig:
    return _llama(raw, attn_bias=True, attn_out_bias=False)  # bias on q, k and v; none on o_proj


def _qwen3(raw: dict) -> TransformerConfig:
    return _llama(raw, qk_norm=True)


# Gemma's released configs say "gelu" and mean the tanh approximation (transformers maps it so).
GEMMA_ACTIVATIONS = {**ACTIVATIONS, "gelu": "gelu_tanh"}


def _gemma(raw: dict) -> TransformerConfig:
    if raw.get("use_bidirectional_attention"):
        raise ValueError("Gemma with use_bidirectional_attention is not a causal language model")
    return _llama(
        raw, norm="rmsnorm_unit_offset", embed_scale=raw["hidden_size"] ** 0.5,
        activation=_activation(raw["hidden_act"], GEMMA_ACTIVATIONS),
    )


_LLAMA_DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                   "max_position_embeddings": 2048}
_QWEN_DEFAULTS = {**_LLAMA_DEFAULTS, "max_position_embeddings": 32768, "use_sliding_window": False}

FAMILIES: dict[str, Family] = {
    "gpt2": Family(_gpt2, GPT2_TENSORS, prefix="transformer.", defaults={
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}),
    "llama": Family(_llama, LLAMA_TENSORS, defaults=_LLAMA_DEFAULTS),
    "mistral": Family(_llama, LLAMA_TENSORS, defaults={
        **_LLAMA_DEFAULTS, "max_position_embeddings": 131072, "sliding_window": 4096}),
    "qwen2": Family(_qwen2, LLAMA_TENSORS, defaults=_QWEN_DEFAULTS),
    "qwen3": Family(_qwen3, QWEN3_TENSORS, defaults={**_QWEN_DEFAULTS, "head_dim": 128}),
    "phi3": Family(_llama, PHI3_TENSORS, defaults={
        **_LLAMA_DEFAULTS, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}),
    "gemma": Family(_gemma, LLAMA_TENSORS, defaults={
        **_LLAMA_DEFAULTS, "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "max_position_embeddings": 8192, "head_dim": 256}),
    "lfm2": Family(lfm2.read_config, LFM2_TENSORS, defaults=lfm2.DEFAULTS, architecture="lfm2"),
    # Our Mamba-2 modules carry the checkpoint's names (backbone.layers.{i}.mixer...).
    "mamba2": Family(read_mamba2_config, None, architecture="mamba2", defaults={
        "vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "expand": 2, "num_heads": 128,
        "head_dim": 64, "state_size": 128, "n_groups": 8, "conv_kernel": 4, "use_bias": False,
        "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": 1e-5, "residual_in_fp32": True,
        "time_step_limit": [0.0, float("inf")], "chunk_size": 256, "tie_word_embeddings": False}),
    "xlstm": Family(_xlstm, None, prefix="backbone.", defaults=XLSTM_DEFAULTS, architecture="xlstm"),
    # Our Mamba modules carry the checkpoint's names too (quill/models/families/mamba.py); Falcon-Mamba is the same architecture.
    "mamba": Family(mamba.read_config, None, defaults=mamba.DEFAULTS, architecture="mamba"),
    "falcon_mamba": Family(mamba.read_config, None, defaults=mamba.FALCON_DEFAULTS, architecture="mamba"),
}
