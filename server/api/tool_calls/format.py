"""One model family's way of writing tool calls into its answer.

A format names the markers that open its calls and splits the text from a marker on into calls.
`ToolCallStream` (stream.py) runs every format the same way, streamed or not, so a format only says
how its text reads.
"""

from __future__ import annotations

from .calls import ToolCall


class ToolCallFormat:
    name: str = ""
    markers: tuple[str, ...] = ()  # text that opens the calls
    at_start_only: bool = False  # the calls are the whole answer (Llama 3): a marker later on is just text
    keeps_special_tokens: bool = False  # a marker is a special token: the answer's text must keep them

    def complete_calls(self, text: str) -> list[ToolCall]:
        """The calls `text` (from the first marker on, still growing) already holds in full. A format that
        cannot tell before the answer ends returns none."""
        return []

    def calls(self, text: str) -> list[ToolCall] | None:
        """The calls of the whole `text` (from the first marker on, the answer ended); None: it holds
        none, and is plain text."""
        raise NotImplementedError
