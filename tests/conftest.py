"""Shared fixtures: tiny tokenizers and tiny random models, built in seconds."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from models.registry import ARCHITECTURES
from models.tokenizer import Tokenizer

TEXT = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles",
]

# Small configs of every architecture and every Transformer flavour.
TINY_CONFIGS = {
    "lstm": ("lstm", dict(d_embed=16, d_hidden=24, n_layers=2, d_proj=16)),
    "lstm-untied": ("lstm", dict(d_embed=16, d_hidden=24, n_layers=1, tie_embeddings=False)),
    "gcnn": ("gcnn", dict(d_embed=16, d_model=24, n_blocks=2, layers_per_block=2, kernel_size=3)),
    "gcnn-k1": ("gcnn", dict(d_embed=24, d_model=24, n_blocks=1, layers_per_block=1, kernel_size=1)),
    "transformer-llama": ("transformer", dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)),
    "transformer-gpt2": (
        "transformer",
        dict(d_model=32, n_layers=2, n_heads=4, positional="learned", norm="layernorm", gated_mlp=False,
             activation="gelu_tanh", attn_bias=True, mlp_bias=True, max_seq_len=64),
    ),
}


def build_hf_tokenizer(vocab_size: int = 300) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(TEXT * 4, trainer)
    return tok


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(build_hf_tokenizer(), eos_token_id=0)


def build_tiny_model(key: str, vocab_size: int = 300, seed: int = 0):
    arch, kwargs = TINY_CONFIGS[key]
    config_cls, model_cls = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    model = model_cls(config_cls(vocab_size=vocab_size, **kwargs)).eval()
    return arch, model
