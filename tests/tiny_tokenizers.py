"""The tests' tiny corpus and the tokenizers trained on it in a fraction of a second: byte-level BPE (GPT-2's kind)
and Metaspace BPE (SentencePiece's kind, as Llama and Mistral)."""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

TEXT = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles",
]


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


METASPACE_SPECIALS = ["<unk>", "<s>", "</s>", "<sep>"]  # ids 0-3; </s> ends a sequence


def build_metaspace_tokenizer(vocab_size: int = 200) -> HFTokenizer:
    """SentencePiece-style, as Llama and Mistral: words carry a leading "▁", and the decoder drops the
    space of the first token it sees ("first": only the text's start gets a "▁" prepended)."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=METASPACE_SPECIALS, show_progress=False)
    tok.train_from_iterator(TEXT * 4, trainer)
    return tok
