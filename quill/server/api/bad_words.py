"""vLLM's `bad_words` request field: words never to generate, as token sequences of the model's tokenizer (the
target side's, for an encoder-decoder).

A word is tokenized as written, its leading spaces dropped, and once more after a space where that makes a word
token of its own (as many tokens, a different first one), so it is banned at the start of the text and after a
space alike. The engine bans a sequence's next token where it would end one of them (quill/server/sampling/ngrams.py).
"""

from __future__ import annotations

from quill.models.text.tokenizer import Tokenizer

from .validation import invalid


def bad_words_token_ids(tokenizer: Tokenizer, words: list[str]) -> list[list[int]]:
    """Their number and length were checked with the request's forms (bounded as stop strings are: both are
    searched at every step)."""
    sequences = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not bare:
            raise invalid(f"bad_words: {word!r} has no tokens", "bad_words")
        sequences.append(bare)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if len(spaced) == len(bare) and spaced[0] != bare[0]:
            sequences.append(spaced)
    return sequences
