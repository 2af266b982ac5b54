"""Byte-level BPE tokenizer trained on the training split, and document encoding for training."""

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 0  # the first special token gets id 0; checked after training
DEFAULT_VOCAB_SIZE = 4096


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE whose decode(encode(text)) == text for any text.

    No prefix space and no normalizer, so nothing is added or lost; the 256-byte initial
    alphabet means every input is encodable without an unknown token.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.token_to_id(EOS_TOKEN) != EOS_TOKEN_ID:
        raise RuntimeError(f"{EOS_TOKEN} should have id {EOS_TOKEN_ID}, got {tokenizer.token_to_id(EOS_TOKEN)}")
    return tokenizer


def load_or_train_bpe(path: Path, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Reuse a tokenizer saved at `path`, so models trained in separate runs share token ids."""
    path = Path(path)
    if path.exists():
        tokenizer = Tokenizer.from_file(str(path))
        if tokenizer.get_vocab_size() != vocab_size or tokenizer.token_to_id(EOS_TOKEN) != EOS_TOKEN_ID:
            raise RuntimeError(f"{path} is not a {vocab_size}-token BPE with {EOS_TOKEN}={EOS_TOKEN_ID}; delete it")
        return tokenizer
    tokenizer = train_bpe(texts, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return tokenizer


def encode_documents(tokenizer: Tokenizer, documents: Iterable[str]) -> np.ndarray:
    """One int64 stream: EOS doc EOS doc ... EOS, so every document starts from the same context
    a generation from scratch starts from, and no prediction crosses a document silently."""
    pieces = [np.array([EOS_TOKEN_ID], dtype=np.int64)]
    for encoding in tokenizer.encode_batch(list(documents), add_special_tokens=False):
        pieces.append(np.asarray(encoding.ids, dtype=np.int64))
        pieces.append(np.array([EOS_TOKEN_ID], dtype=np.int64))
    return np.concatenate(pieces)
