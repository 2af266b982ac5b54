"""A tiny Mamba-2 checkpoint written by transformers' `Mamba2ForCausalLM` (random weights, vocabulary 300)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from tests.conftest import build_hf_tokenizer
from tests.hf_state_models import VOCAB


# Two groups of two heads each, a state of 8 and a short scan chunk, so that the grouped B/C, the grouped norm
# and transformers' own multi-chunk scan are all exercised at a tiny size.
TINY = dict(vocab_size=VOCAB, hidden_size=16, expand=2, num_heads=4, head_dim=8, state_size=8, n_groups=2,
            conv_kernel=4, num_hidden_layers=2, chunk_size=8, layer_norm_epsilon=1e-5, use_conv_bias=True,
            use_bias=False, tie_word_embeddings=False, eos_token_id=5, bos_token_id=5, pad_token_id=5)


def save_tiny(directory: str | Path, **config_changes):
    """Write a tiny Mamba2ForCausalLM (config `TINY` with `config_changes`) and a tokenizer to `directory`;
    return the transformers model (eval, float32)."""
    import transformers

    directory = Path(directory)
    torch.manual_seed(0)
    config = transformers.Mamba2Config(**{**TINY, **config_changes})
    if config.n_groups > 1 and not norms_by_group(transformers):
        pytest.skip(f"transformers {transformers.__version__} normalises Mamba-2's gated norm over all groups at "
                    "once (mamba_ssm and later transformers, like Quill, per group): no reference for n_groups > 1")
    model = transformers.Mamba2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # norms at 1 and biases at 0 would hide a misplaced norm or bias
                param.add_(torch.randn_like(param) * 0.1)
        # A sharper output distribution, so greedy paths are not ties of noise.
        model.get_output_embeddings().weight.mul_(4.0)
    model.save_pretrained(directory)
    build_hf_tokenizer(VOCAB).save(str(directory / "tokenizer.json"))
    return model


def norms_by_group(transformers) -> bool:
    """Whether this transformers' Mamba-2 gated RMSNorm is taken per group of heads (found missing in 5.17)."""
    norm = transformers.models.mamba2.modeling_mamba2.MambaRMSNormGated
    return "group_size" in inspect.signature(norm.__init__).parameters
