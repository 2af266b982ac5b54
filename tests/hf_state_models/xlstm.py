"""A tiny xLSTM checkpoint written by transformers' `xLSTMForCausalLM`."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import torch

from tests.conftest import build_hf_tokenizer
from tests.hf_state_models import VOCAB as V

TINY = dict(
    vocab_size=V, hidden_size=128, num_hidden_layers=2, num_heads=4,  # d_qk 16 and d_v 32 a head
    chunk_size=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
)


def save_tiny(directory: Path, **config_changes):
    """Build the transformers model with tiny random weights, save it and a tokenizer to `directory`; return the
    model (eval, float32). transformers starts the gates with zero weights, which would make them ignore the input,
    and the input gates at -10: both are drawn at random here, so the gates and the stabiliser m do work."""
    import transformers

    torch.manual_seed(0)
    config = transformers.xLSTMConfig(**{**TINY, **config_changes})
    if config.weight_mode == "fused":  # transformers' own init slices the fused gates' bias wrongly and fails
        with mock.patch.object(transformers.xLSTMPreTrainedModel, "_init_weights", lambda self, module: None):
            model = transformers.xLSTMForCausalLM(config).eval()  # PyTorch's default init
    else:
        model = transformers.xLSTMForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # norms and biases
                param.add_(torch.randn_like(param) * 0.1)
            if "gate_preact" in name and "ogate" not in name:  # input and forget gates ("ifgate" when fused)
                param.normal_(0.0, 0.3 if name.endswith("weight") else 1.0)
    directory = Path(directory)
    model.save_pretrained(directory)
    build_hf_tokenizer(V).save(str(directory / "tokenizer.json"))
    return model
