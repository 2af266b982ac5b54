"""The transformers model that runs the same weights as a loaded Quill checkpoint, for `generate()` baselines.

Hugging Face GPT-2 and Llama directories load as they are. Our own Transformer checkpoints
are rebuilt as the equivalent transformers class (Llama-style: `LlamaForCausalLM`, GPT-2-style:
`GPT2LMHeadModel`) by running `quill/models/loading/hf.py`'s name mapping in reverse; the logits of both are
compared once, so a wrong mapping cannot pass unnoticed. The state families (Mamba, Mamba-2, LFM2,
xLSTM) load with transformers' own classes from their Hugging Face directories.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quill.models.loading.checkpoint import LoadedModel

GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
LLAMA_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_pytorch_tanh"}


def _is_llama_style(c) -> bool:
    # Qwen3's q/k norms, Qwen2's bias-free output projection and Gemma's scaled embeddings are not Llama's.
    return (c.positional == "rope" and c.norm == "rmsnorm" and c.gated_mlp and c.activation in LLAMA_ACTIVATIONS
            and not c.qk_norm and c.attn_out_bias == c.attn_bias and c.embed_scale == 1.0)


def _is_gpt2_style(c) -> bool:
    return (c.positional == "learned" and c.norm == "layernorm" and not c.gated_mlp and c.attn_bias and c.mlp_bias
            and c.n_kv_heads == c.n_heads and c.head_dim * c.n_heads == c.d_model and c.activation in GPT2_ACTIVATIONS)


def _llama_from(c, w: dict[str, torch.Tensor], eos: int | None):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, hidden_act=LLAMA_ACTIVATIONS[c.activation],
        attention_bias=c.attn_bias, mlp_bias=c.mlp_bias, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
        tie_word_embeddings=c.tie_embeddings, eos_token_id=eos, pad_token_id=eos, bos_token_id=None,
    )
    sizes = [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim]
    sd = {"model.embed_tokens.weight": w["embed.weight"], "model.norm.weight": w["norm.weight"]}
    for i in range(c.n_layers):
        o, h = f"layers.{i}.", f"model.layers.{i}."
        sd[f"{h}input_layernorm.weight"] = w[f"{o}attn_norm.weight"]
        sd[f"{h}post_attention_layernorm.weight"] = w[f"{o}mlp_norm.weight"]
        kinds = ("weight", "bias") if c.attn_bias else ("weight",)
        for kind in kinds:
            for name, part in zip("qkv", w[f"{o}attn.qkv.{kind}"].split(sizes, dim=0)):
                sd[f"{h}self_attn.{name}_proj.{kind}"] = part
            sd[f"{h}self_attn.o_proj.{kind}"] = w[f"{o}attn.out.{kind}"]
        for kind in ("weight", "bias") if c.mlp_bias else ("weight",):
            gate, up = w[f"{o}mlp.up.{kind}"].chunk(2, dim=0)  # ours is [gate; up]
            sd[f"{h}mlp.gate_proj.{kind}"], sd[f"{h}mlp.up_proj.{kind}"] = gate, up
            sd[f"{h}mlp.down_proj.{kind}"] = w[f"{o}mlp.down.{kind}"]
    sd["lm_head.weight"] = w["embed.weight"] if c.tie_embeddings else w["lm_head.weight"]
    return transformers.LlamaForCausalLM(config), sd


def _gpt2_from(c, w: dict[str, torch.Tensor], eos: int | None):
    import transformers

    config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_embd=c.d_model, n_layer=c.n_layers, n_head=c.n_heads, n_inner=c.d_ff,
        n_positions=c.max_seq_len, layer_norm_epsilon=c.norm_eps, activation_function=GPT2_ACTIVATIONS[c.activation],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=c.tie_embeddings,
        eos_token_id=eos, bos_token_id=eos, pad_token_id=eos,
    )
    sd = {"transformer.wte.weight": w["embed.weight"], "transformer.wpe.weight": w["pos_embed.weight"],
          "transformer.ln_f.weight": w["norm.weight"], "transformer.ln_f.bias": w["norm.bias"]}
    for i in range(c.n_layers):
        o, h = f"layers.{i}.", f"transformer.h.{i}."
        for ours, theirs in [("attn_norm", "ln_1"), ("mlp_norm", "ln_2")]:
            for kind in ("weight", "bias"):
                sd[f"{h}{theirs}.{kind}"] = w[f"{o}{ours}.{kind}"]
        for ours, theirs in [("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"), ("mlp.up", "mlp.c_fc"),
                             ("mlp.down", "mlp.c_proj")]:
            sd[f"{h}{theirs}.weight"] = w[f"{o}{ours}.weight"].t()  # GPT-2's Conv1D stores (in, out)
            sd[f"{h}{theirs}.bias"] = w[f"{o}{ours}.bias"]
    sd["lm_head.weight"] = w["embed.weight"] if c.tie_embeddings else w["lm_head.weight"]
    return transformers.GPT2LMHeadModel(config), sd


def _is_hf_directory(path: Path) -> bool:
    config = path / "config.json"
    return config.is_file() and "model_type" in json.loads(config.read_text())


def hf_model_for(loaded: LoadedModel):
    """(transformers model in eval mode, how it was made) for a loaded Transformer or Hugging Face state model."""
    import transformers

    c = loaded.model.config
    # A state family (Mamba, LFM2, ...) is run by transformers' own class, from the Hugging Face directory it came from.
    from_directory = loaded.architecture != "transformer" or c.extra.get("hf_model_type")
    if from_directory and not _is_hf_directory(Path(loaded.path)):
        raise ValueError(f"{loaded.path}: not a Hugging Face directory; transformers has no class for this "
                         f"{loaded.architecture} checkpoint")
    if from_directory:
        model = transformers.AutoModelForCausalLM.from_pretrained(loaded.path, dtype=loaded.dtype)
        model = model.to(loaded.device).eval().requires_grad_(False)
        return model, f"{type(model).__name__} loaded from the directory"
    eos = loaded.eos_token_ids[0] if loaded.eos_token_ids else None
    weights = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    if _is_llama_style(c):
        model, sd = _llama_from(c, weights, eos)
    elif _is_gpt2_style(c):
        model, sd = _gpt2_from(c, weights, eos)
    else:
        raise ValueError(f"{loaded.path}: no transformers class matches this Transformer configuration")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" or not c.tie_embeddings]
    if missing or unexpected:
        raise ValueError(f"rebuilding {loaded.path} as {type(model).__name__}: "
                         f"missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        model.tie_weights()
    model = model.to(device=loaded.device, dtype=loaded.dtype).eval().requires_grad_(False)
    return model, f"{type(model).__name__} rebuilt from our weights"


@torch.inference_mode()
def max_logit_difference(loaded: LoadedModel, model, length: int = 12) -> float:
    """Largest |logit| difference between our model and the transformers one on a fixed input."""
    length = min(length, loaded.max_seq_len or length)
    tokens = torch.randint(0, loaded.model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(loaded.device)
    ours = loaded.model(tokens).float()
    theirs = model(tokens).logits.float()
    return (ours - theirs).abs().max().item()


def pad_token_id(loaded: LoadedModel) -> int:
    """What left-padding fills with: end-of-sequence, as for GPT-2 (masked out, so any id would do)."""
    return loaded.eos_token_ids[0] if loaded.eos_token_ids else 0
