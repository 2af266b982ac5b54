"""The character-level language model's data: a byte vocabulary (the end-of-text token, then the 256 bytes) and the
plays as byte streams, in the shared Dataset so the language models' training and evaluation run unchanged.

A Hugging Face byte-level BPE with no merges is exactly a byte tokenizer: every byte its own token, decoded back to
the same bytes (a UTF-8 character split across tokens is held back until it is whole, as for any byte-level BPE).
The plays are ASCII, so a byte is a character; bits per character are counted per character all the same.
"""

import math
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from quill.models.training.bpe import EOS_TOKEN, EOS_TOKEN_ID
from quill.models.training.corpus import load_shakespeare
from quill.models.training.pipeline import Dataset, encode_split

BYTE_VOCAB_SIZE = 257


def byte_symbols() -> list[str]:
    """GPT-2's byte-level symbol of each byte 0..255: printable Latin-1 bytes stand for themselves, the others take
    code points from U+0100 on, in byte order (what pre_tokenizers.ByteLevel maps bytes to)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    symbols = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return [symbols[b] for b in range(256)]


def byte_tokenizer() -> Tokenizer:
    """End of text at id 0 (as the BPE language models have it), byte b at id b + 1."""
    vocab = {EOS_TOKEN: EOS_TOKEN_ID, **{symbol: b + 1 for b, symbol in enumerate(byte_symbols())}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.add_special_tokens([EOS_TOKEN])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def prepare_byte_dataset(data_dir: Path) -> Dataset:
    """The training and held-out plays as byte streams, EOS before and after each."""
    return encode_split(byte_tokenizer(), load_shakespeare(data_dir))


def held_out_characters(data_dir: Path) -> int:
    return sum(len(text) for text in load_shakespeare(data_dir).validation.values())


def bits_per_character(perplexity: float, validation_ids: np.ndarray, characters: int) -> float:
    """The held-out stream's total information in bits, over its characters: log2(per-token perplexity) times the
    tokens predicted (every byte of the plays and the end-of-text after each), divided by the plays' characters."""
    return math.log2(perplexity) * (validation_ids.size - 1) / characters
