"""Word-level tokenizers for the classic toolkits' vocabularies, behind Quill's `Tokenizer` interface.

The toolkits split text on whitespace and map each word to its id, unknown words to one unknown
token. Built as a Hugging Face `tokenizers` WordLevel model, so it saves as tokenizer.json and
streams through the same incremental decoder as the BPE tokenizers: decoding joins words with
single spaces, so a streamed word arrives whole, with the space before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from models.tokenizer import Tokenizer


def word_tokenizer(words: Sequence[str], *, unk_token: str | None, eos_token: str | None = None,
                   special_tokens: Sequence[str] = ()) -> Tokenizer:
    """A tokenizer whose id i is `words[i]`. `unk_token` (one of `words`) stands for any word not in the
    list; `eos_token` ends a sequence; `special_tokens` are dropped from decoded text when asked."""
    vocab: dict[str, int] = {}
    for i, word in enumerate(words):
        vocab.setdefault(word, i)  # a word listed twice keeps its first id, as the toolkits look it up
    for name, token in (("unk_token", unk_token), ("eos_token", eos_token)):
        if token is not None and token not in vocab:
            raise ValueError(f"{name} {token!r} is not in the vocabulary")
    hf = HFTokenizer(models.WordLevel(vocab, unk_token=unk_token))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = [t for t in special_tokens if t in vocab]
    if specials:
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return Tokenizer(hf, None if eos_token is None else vocab[eos_token])
