"""Tiny LFM2 checkpoints written by transformers' own `Lfm2ForCausalLM`: five layers, two of them attention."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tests.conftest import build_hf_tokenizer
from tests.hf_state_models import VOCAB as V


# Conv layers around the attention ones as in the released models (LFM2-350M: attention at 2, 5, 8, 10, 12, 14),
# grouped-query heads, and an intermediate size that LFM2's 2/3-then-round-up rule changes (96 -> 64). Weights
# of std 0.2, not transformers' 0.02: at 0.02 the conv layers add ~1e-5 to the residual stream, too little for a
# wrong conv state to change a greedy token, and a tied model mostly repeats its last input.
TINY = dict(
    vocab_size=V, hidden_size=32, intermediate_size=96, block_multiple_of=16, num_hidden_layers=5,
    num_attention_heads=4, num_key_value_heads=2, full_attn_idxs=[1, 4], conv_L_cache=3,
    max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2,
)


def save_tiny(directory: Path, **config_changes) -> transformers.Lfm2ForCausalLM:
    """Save a tiny random LFM2 (TINY with `config_changes`) and a tokenizer.json into `directory`; return the
    transformers model, in eval mode and float32."""
    torch.manual_seed(0)
    model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**{**TINY, **config_changes})).eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: move them, so that a test sees them
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    build_hf_tokenizer(V).save(str(Path(directory) / "tokenizer.json"))
    return model
