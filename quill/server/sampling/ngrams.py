"""Bans that depend on a sequence's own tokens, by transformers' rules: `no_repeat_ngram_size` (never repeat an
n-gram of its own) and bad words (never end one of these token sequences).

The next token is banned where it would complete an n-gram that already occurs in the sequence, or a bad word
whose tokens but the last end the sequence (the prompt's tokens included, as `generate` counts them: a
decoder-only model's prompt and output, an encoder-decoder's decoder tokens from its start token on). Applied to
the sequence's logits (sampling) or to its beam's log-probabilities (beam search) as a token mask, the way a
grammar's mask is (quill/server/engine/grammar_masks.py).
"""

from __future__ import annotations


def banned_by_ngrams(token_ids: list[int], n: int) -> list[int]:
    """Tokens that would complete an n-gram already in `token_ids` (none before n - 1 tokens exist)."""
    if n < 1 or len(token_ids) + 1 < n:
        return []
    if n == 1:
        return list(dict.fromkeys(token_ids))
    prefix = tuple(token_ids[len(token_ids) - n + 1:])
    return list(dict.fromkeys(token_ids[i + n - 1] for i in range(len(token_ids) - n + 1)
                              if tuple(token_ids[i:i + n - 1]) == prefix))


def banned_by_bad_words(token_ids: list[int], words: list[list[int]]) -> list[int]:
    """The last tokens of the bad words whose other tokens end `token_ids` (a one-token word: always)."""
    banned = []
    for word in words:
        head = len(word) - 1
        if head == 0 or (len(token_ids) >= head and token_ids[len(token_ids) - head:] == word[:-1]):
            banned.append(word[-1])
    return banned


def clear_bits(bitmask, row: int, tokens: list[int]) -> None:
    """Forbid `tokens` in row `row` of an allowed-token bitmask (llguidance's layout: bit t % 32 of word t // 32)."""
    view = bitmask[row]
    for token in tokens:
        word, bit = divmod(token, 32)
        value = int(view[word]) & 0xFFFFFFFF & ~(1 << bit)
        view[word] = value - (1 << 32) if value >= 1 << 31 else value  # the word is a signed int32
