"""Word-level tokenizers for the classic toolkits' vocabularies, behind Quill's `Tokenizer` interface.

The toolkits split text on whitespace and map each word to its id, unknown words to one unknown
token. Built as a Hugging Face `tokenizers` WordLevel model, so it saves as tokenizer.json and
streams through the same incremental decoder as the BPE tokenizers: decoding joins words with
single spaces, so a streamed word arrives whole, with the space before it.

Corpora trained line by line end each line with a word of their own (`<eos>` in PyTorch's
word_language_model): given as `newline_token`, a newline in the text encodes to it and it decodes
as a newline, so a prompt and a continuation span lines as the training text did.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, decoders, normalizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from quill.models.text.tokenizer import Tokenizer

_NO_PREFIX = "\u0000"  # WordPiece's continuation prefix, which no word starts with: every word gets its space


def word_tokenizer(words: Sequence[str], *, unk_token: str | None, eos_token: str | None = None,
                   special_tokens: Sequence[str] = (), newline_token: str | None = None) -> Tokenizer:
    """A tokenizer whose id i is `words[i]`. `unk_token` (one of `words`) stands for any word not in the
    list; `eos_token` ends a sequence; `special_tokens` are dropped from decoded text when asked;
    `newline_token` is the word a newline encodes to and that decodes as one."""
    vocab: dict[str, int] = {}
    for i, word in enumerate(words):
        vocab.setdefault(word, i)  # a word listed twice keeps its first id, as the toolkits look it up
    for name, token in (("unk_token", unk_token), ("eos_token", eos_token), ("newline_token", newline_token)):
        if token is not None and token not in vocab:
            raise ValueError(f"{name} {token!r} is not in the vocabulary")
    hf = HFTokenizer(models.WordLevel(vocab, unk_token=unk_token))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if newline_token is not None:
        hf.normalizer = normalizers.Replace(Regex(r"\r?\n"), f" {newline_token} ")
        # Words joined by spaces (WordPiece with no continuations), then the newline word and the spaces
        # beside it become one newline: "a <eos> b" -> "a\nb".
        hf.decoder = decoders.Sequence([
            decoders.WordPiece(prefix=_NO_PREFIX, cleanup=False), decoders.Fuse(),
            decoders.Replace(Regex(f" ?{_escape(newline_token)} ?"), "\n"),
        ])
    specials = [t for t in special_tokens if t in vocab]
    if specials:
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return Tokenizer(hf, None if eos_token is None else vocab[eos_token])


def _escape(word: str) -> str:
    """`word` as a literal in the Oniguruma regex that tokenizers uses."""
    return "".join("\\" + ch if not ch.isalnum() and ch != "_" else ch for ch in word)
