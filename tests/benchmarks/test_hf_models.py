"""Our Transformer checkpoints rebuilt as their transformers class: the same logits, or the baseline is void."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.common.hf_models import hf_model_for, max_logit_difference
from quill.models.loading.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import build_tiny_model


@pytest.mark.parametrize("key, hf_class", [("transformer-llama", "LlamaForCausalLM"),
                                            ("transformer-gpt2", "GPT2LMHeadModel")])
def test_our_transformers_rebuild_as_their_transformers_class(key, hf_class, tiny_tokenizer, tmp_path):
    arch, model = build_tiny_model(key, tiny_tokenizer.vocab_size)
    with torch.no_grad():  # norms at 1 and biases at 0 would hide a mix-up of those tensors
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    path = save_checkpoint(tmp_path, arch, model, tiny_tokenizer, dtype=torch.float32)
    loaded = load_checkpoint(path, device="cpu", dtype="float32")  # `auto` may pick bfloat16 on this CPU
    hf, how = hf_model_for(loaded)
    assert type(hf).__name__ == hf_class and "rebuilt" in how
    assert max_logit_difference(loaded, hf, length=20) < 1e-4


def test_a_recurrent_model_has_no_transformers_twin(tiny_tokenizer, tmp_path):
    arch, model = build_tiny_model("lstm", tiny_tokenizer.vocab_size)
    path = save_checkpoint(tmp_path, arch, model, tiny_tokenizer, dtype=torch.float32)
    loaded = load_checkpoint(path, device="cpu", dtype="float32")  # `auto` may pick bfloat16 on this CPU
    with pytest.raises(ValueError, match="transformers has no class for this lstm"):
        hf_model_for(loaded)
