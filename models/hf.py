"""Hugging Face GPT-2 and Llama checkpoints, read as they are on disk.

Maps a `config.json` to a `TransformerConfig` and the checkpoint's tensor names to
ours (fusing q/k/v and gate/up into single matmuls, transposing GPT-2's Conv1D).
No conversion step: this runs at load time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .transformer import TransformerConfig

HF_MODEL_TYPES = ("gpt2", "llama")


@dataclass
class TensorSource:
    """Our parameter `name` is built from the checkpoint tensors `sources` by `combine`."""

    name: str
    sources: list[str]
    combine: Callable[[list[torch.Tensor]], torch.Tensor]


def _single(ts):
    return ts[0]


def _transposed(ts):
    return ts[0].t()


def _concat(ts):
    return torch.cat(ts, dim=0)


def is_hf_config(raw: dict) -> bool:
    return "architecture" not in raw and ("model_type" in raw or "architectures" in raw)


def _eos_ids(raw: dict) -> list[int]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list) else [eos]


def config_from_hf(raw: dict) -> tuple[TransformerConfig, list[int]]:
    """config.json of a GPT-2 or Llama checkpoint -> our config and its end-of-sequence ids."""
    model_type = raw.get("model_type")
    if model_type == "gpt2":
        if raw.get("scale_attn_by_inverse_layer_idx") or raw.get("reorder_and_upcast_attn"):
            raise ValueError("GPT-2 variants with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported")
        act = raw.get("activation_function", "gelu_new")
        activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
        if act not in activations:
            raise ValueError(f"unsupported GPT-2 activation_function {act!r}")
        config = TransformerConfig(
            vocab_size=raw["vocab_size"], d_model=raw["n_embd"], n_layers=raw["n_layer"], n_heads=raw["n_head"],
            d_ff=raw.get("n_inner") or 4 * raw["n_embd"], max_seq_len=raw["n_positions"], positional="learned",
            norm="layernorm", norm_eps=raw.get("layer_norm_epsilon", 1e-5), gated_mlp=False,
            activation=activations[act], attn_bias=True, mlp_bias=True,
            tie_embeddings=raw.get("tie_word_embeddings", True), extra={"hf_model_type": "gpt2"},
        )
        return config, _eos_ids(raw)
    if model_type == "llama":
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", None) or raw.get("rope_theta", 10000.0)
        if raw.get("hidden_act", "silu") not in ("silu", "gelu", "relu"):
            raise ValueError(f"unsupported Llama hidden_act {raw.get('hidden_act')!r}")
        config = TransformerConfig(
            vocab_size=raw["vocab_size"], d_model=raw["hidden_size"], n_layers=raw["num_hidden_layers"],
            n_heads=raw["num_attention_heads"], n_kv_heads=raw.get("num_key_value_heads"),
            head_dim=raw.get("head_dim"), d_ff=raw["intermediate_size"],
            max_seq_len=raw.get("max_position_embeddings", 2048), positional="rope", norm="rmsnorm",
            norm_eps=raw.get("rms_norm_eps", 1e-6), gated_mlp=True, activation=raw.get("hidden_act", "silu"),
            attn_bias=raw.get("attention_bias", False), mlp_bias=raw.get("mlp_bias", False),
            rope_theta=float(theta), rope_scaling=rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None,
            tie_embeddings=raw.get("tie_word_embeddings", False), extra={"hf_model_type": "llama"},
        )
        return config, _eos_ids(raw)
    raise ValueError(f"unsupported Hugging Face model_type {model_type!r} (supported: {', '.join(HF_MODEL_TYPES)})")


def _gpt2_sources(config: TransformerConfig, prefix: str) -> list[TensorSource]:
    p = prefix
    out = [
        TensorSource("embed.weight", [f"{p}wte.weight"], _single),
        TensorSource("pos_embed.weight", [f"{p}wpe.weight"], _single),
        TensorSource("norm.weight", [f"{p}ln_f.weight"], _single),
        TensorSource("norm.bias", [f"{p}ln_f.bias"], _single),
    ]
    for i in range(config.n_layers):
        h, o = f"{p}h.{i}.", f"layers.{i}."
        for ours, theirs, fn in [
            ("attn_norm", "ln_1", _single), ("mlp_norm", "ln_2", _single),
        ]:
            out += [TensorSource(f"{o}{ours}.{w}", [f"{h}{theirs}.{w}"], fn) for w in ("weight", "bias")]
        for ours, theirs in [("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"), ("mlp.up", "mlp.c_fc"), ("mlp.down", "mlp.c_proj")]:
            out.append(TensorSource(f"{o}{ours}.weight", [f"{h}{theirs}.weight"], _transposed))  # Conv1D stores (in, out)
            out.append(TensorSource(f"{o}{ours}.bias", [f"{h}{theirs}.bias"], _single))
    if not config.tie_embeddings:
        out.append(TensorSource("lm_head.weight", ["lm_head.weight"], _single))
    return out


def _llama_sources(config: TransformerConfig, prefix: str) -> list[TensorSource]:
    p = prefix
    out = [
        TensorSource("embed.weight", [f"{p}embed_tokens.weight"], _single),
        TensorSource("norm.weight", [f"{p}norm.weight"], _single),
    ]
    for i in range(config.n_layers):
        h, o = f"{p}layers.{i}.", f"layers.{i}."
        out += [
            TensorSource(f"{o}attn_norm.weight", [f"{h}input_layernorm.weight"], _single),
            TensorSource(f"{o}mlp_norm.weight", [f"{h}post_attention_layernorm.weight"], _single),
        ]
        fused = [
            ("attn.qkv", [f"{h}self_attn.{x}_proj" for x in "qkv"], config.attn_bias),
            ("attn.out", [f"{h}self_attn.o_proj"], config.attn_bias),
            ("mlp.up", [f"{h}mlp.gate_proj", f"{h}mlp.up_proj"], config.mlp_bias),
            ("mlp.down", [f"{h}mlp.down_proj"], config.mlp_bias),
        ]
        for ours, theirs, has_bias in fused:
            kinds = ("weight", "bias") if has_bias else ("weight",)
            out += [TensorSource(f"{o}{ours}.{w}", [f"{t}.{w}" for t in theirs], _concat) for w in kinds]
    if not config.tie_embeddings:
        out.append(TensorSource("lm_head.weight", ["lm_head.weight"], _single))
    return out


def tensor_sources(config: TransformerConfig, names: set[str]) -> list[TensorSource]:
    """Where each of our parameters comes from, given the tensor names the file holds."""
    model_type = config.extra["hf_model_type"]
    if model_type == "gpt2":
        prefix = "transformer." if "transformer.wte.weight" in names else ""
        return _gpt2_sources(config, prefix)
    prefix = "model." if "model.embed_tokens.weight" in names else ""
    return _llama_sources(config, prefix)
