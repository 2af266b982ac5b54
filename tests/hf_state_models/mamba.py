"""Tiny Mamba-1 and Falcon-Mamba checkpoints (`MambaForCausalLM`, `FalconMambaForCausalLM`) with random weights."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.hf_state_models import VOCAB as V

TINY = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4,
            eos_token_id=5, bos_token_id=5, pad_token_id=5)
MODEL_TYPES = ("mamba", "falcon_mamba")


def save_tiny(directory: str | Path, model_type: str = "mamba", **config_changes):
    """Write a tiny random `model_type` checkpoint and a tokenizer.json to `directory`; returns the transformers
    model (eval, float32). `config_changes` override the tiny config (any MambaConfig/FalconMambaConfig key)."""
    import transformers

    from tests.conftest import build_hf_tokenizer

    directory = Path(directory)
    config_cls, model_cls = {
        "mamba": (transformers.MambaConfig, transformers.MambaForCausalLM),
        "falcon_mamba": (transformers.FalconMambaConfig, transformers.FalconMambaForCausalLM),
    }[model_type]  # one of MODEL_TYPES
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY, **config_changes})).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms, biases, D: away from their 1 / 0 initial values, so each one matters
                p.add_(torch.randn_like(p) * 0.1)
        # At their initial scale the scan's output moves the logits by about 0.01: larger time steps (0.03 to
        # 0.5 instead of 0.001 to 0.1), B, C and out_proj make the recurrence, and any error in carrying its
        # state, show in the logits (about 0.4 when a chunk starts from a zero state instead of its own).
        rank = model.config.time_step_rank
        for layer in model.backbone.layers:
            layer.mixer.dt_proj.bias.add_(1.5)
            layer.mixer.x_proj.weight[rank:].mul_(4.0)
            layer.mixer.out_proj.weight.mul_(3.0)
    model.save_pretrained(directory)
    build_hf_tokenizer(V).save(str(directory / "tokenizer.json"))
    return model
