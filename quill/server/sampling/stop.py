"""When one sequence stops, and how much of its text may be streamed before it does.

Feed a StopChecker every generated token, in order, with the sequence's whole output text so far
(the new token's text included). A streaming engine then, per step:

    decision = checker.check(token_id, text, num_output_tokens)
    if decision.finished:
        final = text[: len(text) - decision.trim]   # send final[sent:], then end the stream
    else:
        visible = len(text) - checker.hold_back(text)  # send text[sent:visible]

`hold_back` keeps back the longest tail of the text that begins some stop string, so a client
never sees part of a stop string that then completes: `sent` never passes where a stop string
starts, and `visible` never decreases.

The rules and their order are vLLM's: nothing ends a sequence before min_tokens tokens were
generated before the current one (the sampler bans EOS and stop ids until then, and stop strings
are not searched); then EOS (unless ignore_eos), stop_token_ids, stop strings, and max_tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

from .params import SamplingParams


class StopDecision(NamedTuple):
    finished: bool
    finish_reason: Literal["stop", "length"] | None
    trim: int  # trailing characters to cut from the output text: the stop string onwards, or the stop token's text


_GO_ON = StopDecision(False, None, 0)


class StopChecker:
    """Stop rules of one sequence. After a stop, `stop_reason` is the matched stop string or stop
    token id (None for EOS and length), as vLLM reports it."""

    def __init__(self, params: SamplingParams, eos_token_ids: Iterable[int]):
        self.max_tokens = params.max_tokens
        self.min_tokens = params.min_tokens
        self.stop_strings = tuple(params.stop)
        self.eos_token_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.stop_reason: str | int | None = None
        self._checked_len = 0  # characters of output text already searched for stop strings

    def check(self, new_token_id: int, text: str, num_output_tokens: int) -> StopDecision:
        """`text`: the whole output so far, the new token's text included; it only ever grows at the end.
        `num_output_tokens`: generated tokens, the new one included."""
        num_new_chars = len(text) - self._checked_len
        search_from = self._checked_len
        self._checked_len = len(text)
        if num_output_tokens > self.min_tokens:
            # A stop token's own text is not part of the output (vLLM: include_stop_str_in_output=False).
            if new_token_id in self.eos_token_ids:
                return StopDecision(True, "stop", max(num_new_chars, 0))
            if new_token_id in self.stop_token_ids:
                self.stop_reason = new_token_id
                return StopDecision(True, "stop", max(num_new_chars, 0))
            start = self._find_stop_string(text, search_from)
            if start is not None:
                return StopDecision(True, "stop", len(text) - start)
        if num_output_tokens >= self.max_tokens:
            return StopDecision(True, "length", 0)
        return _GO_ON

    def _find_stop_string(self, text: str, search_from: int) -> int | None:
        """Where the earliest stop string ending in text[search_from:] starts; sets stop_reason."""
        earliest = None
        for stop in self.stop_strings:
            # Only matches that end in the new characters: older ones were searched (or skipped) already.
            start = text.find(stop, max(0, search_from - len(stop) + 1))
            if start != -1 and (earliest is None or start < earliest):
                earliest, self.stop_reason = start, stop
        return earliest

    def hold_back(self, text: str) -> int:
        """How many trailing characters of `text` must not be streamed yet: the longest tail that is
        a proper prefix of some stop string, and could still complete into one."""
        longest = 0
        for stop in self.stop_strings:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
