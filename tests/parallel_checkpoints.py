"""Tiny Hugging Face checkpoints for the tensor-parallel tests, written by transformers' own `save_pretrained`.

- "llama": grouped-query attention (4 heads, 2 K,V heads), a gated MLP, RoPE: split 2 ways, a K,V head per rank.
- "llama-kv1": one K,V head: split 2 ways, every rank holds it (replicated).
- "gpt2": learned positions, LayerNorm, biases everywhere, Conv1D weights stored transposed, tied embeddings, and an
  odd vocabulary (301): split 2 ways, the second rank's last vocabulary row is padding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_tokenizers import build_hf_tokenizer

KINDS = ("llama", "llama-kv1", "gpt2")
VOCAB = {"llama": 300, "llama-kv1": 300, "gpt2": 301}
EOS = 5


def write_checkpoint(kind: str, directory: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    vocab = VOCAB[kind]
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                         eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1 if kind == "llama-kv1" else 2, max_position_embeddings=128, eos_token_id=EOS,
            bos_token_id=1, pad_token_id=EOS)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # sharper distributions: greedy paths are not ties of noise
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(directory, safe_serialization=True)
    build_hf_tokenizer(vocab).save(str(directory / "tokenizer.json"))
    return directory


def write_checkpoints(root: Path) -> dict[str, Path]:
    return {kind: write_checkpoint(kind, root / kind) for kind in KINDS}
