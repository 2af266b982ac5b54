"""One sequence's place in its grammar, and the batched fill of the token masks of a step.

A mask is a row of int32 words, bit t of word t // 32 set when token t may come next (llguidance's layout).
"""

from __future__ import annotations

import torch
from llguidance import LLExecutor, LLMatcher


class GrammarMatcher:
    """Advances with each committed token; forks with its sequence (n samples, beams)."""

    __slots__ = ("_matcher", "num_tokens")

    def __init__(self, matcher: LLMatcher):
        self._matcher = matcher
        self.num_tokens = 0  # tokens consumed, what `rollback` can undo

    def consume(self, token_id: int) -> bool:
        """Take the sequence's next token; False if the grammar does not allow it (the matcher is then in error)."""
        ok = self._matcher.consume_token(token_id)
        self.num_tokens += ok
        return ok

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` tokens (tokens the engine dropped after they were consumed)."""
        self._matcher.rollback(num_tokens)
        self.num_tokens -= num_tokens

    def fork(self) -> GrammarMatcher:
        copy = GrammarMatcher(self._matcher.deep_copy())
        copy.num_tokens = self.num_tokens
        return copy

    @property
    def is_done(self) -> bool:
        """The grammar is complete and allows nothing more (but EOS): the sequence ends with "stop"."""
        return self._matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        return self._matcher.is_accepting()

    @property
    def error(self) -> str:
        return self._matcher.get_error()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the next token's mask into row `row` of a (C, words) int32 host tensor."""
        view = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * 4)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def fill_bitmasks(executor: LLExecutor, matchers: list[GrammarMatcher], bitmask: torch.Tensor) -> None:
    """Row i of `bitmask` (C, words), contiguous int32 on the host, gets matchers[i]'s mask, the rows in parallel."""
    if len(matchers) == 1:
        matchers[0].fill(bitmask, 0)
        return
    executor.unsafe_compute_mask_ptr([(m._matcher, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                     bitmask.shape[1] * 4, bitmask.shape[0])
