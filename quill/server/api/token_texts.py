"""The texts of tokens in log-probability blocks, each in the context of the tokens before it.

A token decoded alone is not its part of the text: a Metaspace token loses its leading space and a
byte-level piece of a character decodes to U+FFFD. Here a chosen token's text is what it adds after
the tokens before it (a piece of a character adds "" and the token that completes it adds the whole
character), so a sequence's token texts concatenate to its text and a client can draw a span per
token; an alternative's text is what it would have added in the chosen token's place (a piece of a
character shows as U+FFFD there: nothing will complete it). Special tokens are shown, as in every
dialect's token lists.
"""

from __future__ import annotations

from collections.abc import Sequence

from quill.models.text.tokenizer import IncrementalDecoder, Tokenizer
from quill.server.engine import TokenLogprob


class TokenTexts:
    """One sequence's token texts, in order; `context_ids` are the tokens before the first one."""

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = ()):
        self._decoder = IncrementalDecoder(tokenizer, context_ids, skip_special_tokens=False)

    def next(self, token_id: int, entry: TokenLogprob | None = None, is_last: bool = False) -> tuple[str, list]:
        """The text `token_id` adds, and `entry`'s alternatives as (token id, text, log-probability); the
        chosen token among them reads as it does itself."""
        top = entry.top if entry is not None else []
        alternative_texts = self._decoder.peek([t for t, _ in top]) if top else []
        text = self._decoder.push(token_id)
        if is_last:
            text += self._decoder.flush()
        return text, [(t, text if t == token_id else alt, lp) for (t, lp), alt in zip(top, alternative_texts)]
