"""Hugging Face `transformers` `generate()` on the bench's workload, in-process, on the same weights.

Hugging Face GPT-2 and Llama directories load as they are. Our own Transformer checkpoints
are rebuilt as the equivalent transformers class (Llama-style: `LlamaForCausalLM`, GPT-2-style:
`GPT2LMHeadModel`) by running `models/hf.py`'s name mapping in reverse; the logits of both are
compared once, so a wrong mapping cannot pass unnoticed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from models.checkpoint import LoadedModel

GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
LLAMA_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_pytorch_tanh"}


@dataclass
class BaselineItem:
    """One request of the workload, tokenized: what both in-process baselines run."""

    prompt_ids: list[int]
    max_tokens: int
    options: dict  # the strategy's client options (temperature, top_p, beam_width, n, ...)

    @property
    def num_returned(self) -> int:
        """Sequences that come back (beam search returns one), as the server's usage counts them."""
        return self.options.get("n", 1)


def one_per_strategy(items: list[BaselineItem], max_tokens: int = 4) -> list[BaselineItem]:
    """Short warm-up requests, one per distinct decoding setting: first calls of a code path are slow."""
    seen = {}
    for item in items:
        seen.setdefault(repr(sorted(item.options.items())), BaselineItem(item.prompt_ids, max_tokens, item.options))
    return list(seen.values())


def _is_llama_style(c) -> bool:
    return c.positional == "rope" and c.norm == "rmsnorm" and c.gated_mlp and c.activation in LLAMA_ACTIVATIONS


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


def hf_model_for(loaded: LoadedModel):
    """(transformers model in eval mode, how it was made) for a loaded Transformer checkpoint."""
    import transformers

    if loaded.architecture != "transformer":
        raise ValueError(f"--baseline hf needs a Transformer checkpoint; {loaded.path} is {loaded.architecture}")
    c = loaded.model.config
    if c.extra.get("hf_model_type"):
        model = transformers.AutoModelForCausalLM.from_pretrained(loaded.path, dtype=loaded.dtype)
        return model.to(loaded.device).eval(), f"{type(model).__name__} loaded from the directory"
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
    length = min(length, loaded.model.config.max_seq_len)
    tokens = torch.randint(0, loaded.model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(loaded.device)
    ours = loaded.model(tokens).float()
    theirs = model(tokens).logits.float()
    return (ours - theirs).abs().max().item()


def generate_kwargs(options: dict, max_tokens: int, ignore_eos: bool) -> dict:
    """The bench's client options as `generate()` arguments (the same decoding the server is asked for)."""
    kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens if ignore_eos else 0)
    if "beam_width" in options:
        return kw | dict(do_sample=False, num_beams=options["beam_width"], num_return_sequences=options.get("n", 1))
    if options.get("temperature", 1.0) == 0:
        return kw | dict(do_sample=False)
    kw |= dict(do_sample=True, temperature=options.get("temperature", 1.0), top_k=max(0, options.get("top_k", 0)),
               top_p=options.get("top_p", 1.0), num_return_sequences=options.get("n", 1))
    if "min_p" in options:
        kw["min_p"] = options["min_p"]
    return kw


@torch.inference_mode()
def _generate(model, rows: list[list[int]], kw: dict, pad_id: int) -> None:
    """One left-padded batch (a batch of one needs no padding)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    device = next(model.parameters()).device
    model.generate(ids.to(device), attention_mask=mask.to(device), pad_token_id=pad_id, **kw)


def run_serial(model, items: list[BaselineItem], ignore_eos: bool, pad_id: int) -> dict:
    """`generate()` one request at a time, each after the previous one finished."""
    for warm in one_per_strategy(items):
        _generate(model, [warm.prompt_ids], generate_kwargs(warm.options, warm.max_tokens, ignore_eos), pad_id)
    start = time.perf_counter()
    for item in items:
        _generate(model, [item.prompt_ids], generate_kwargs(item.options, item.max_tokens, ignore_eos), pad_id)
    seconds = time.perf_counter() - start
    tokens = sum(i.max_tokens * i.num_returned for i in items)
    return {"num_requests": len(items), "output_tokens": tokens, "seconds": seconds,
            "output_token_throughput": tokens / seconds}


def run_static_batches(model, items: list[BaselineItem], batch_size: int, ignore_eos: bool, pad_id: int) -> dict:
    """Static batching: requests of the same decoding settings, `batch_size` at a time in arrival order, each batch
    left-padded and run to its longest max_tokens before the next starts."""
    groups: dict[str, list[BaselineItem]] = {}
    for item in items:
        groups.setdefault(repr(sorted(item.options.items())), []).append(item)
    batches = [g[i:i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]
    for warm in one_per_strategy(items):
        _generate(model, [warm.prompt_ids] * 2, generate_kwargs(warm.options, warm.max_tokens, ignore_eos), pad_id)
    start = time.perf_counter()
    computed = 0
    for batch in batches:
        longest = max(i.max_tokens for i in batch)
        kw = generate_kwargs(batch[0].options, longest, ignore_eos)
        _generate(model, [i.prompt_ids for i in batch], kw, pad_id)
        computed += longest * sum(i.num_returned for i in batch)
    seconds = time.perf_counter() - start
    tokens = sum(i.max_tokens * i.num_returned for i in items)
    return {"num_requests": len(items), "batch_size": batch_size, "num_batches": len(batches), "output_tokens": tokens,
            "computed_tokens": computed, "seconds": seconds, "output_token_throughput": tokens / seconds}
