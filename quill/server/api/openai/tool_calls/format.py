"""One model family's way of writing tool calls into its answer.

A format names the markers that open its calls and reads the text from the first marker on as calls,
the last of which may still be arriving. `ToolCallStream` (stream.py) runs every format the same way,
streamed or not, so a format only says how its text reads.
"""

from __future__ import annotations

from .calls import PartialCall


class ToolCallFormat:
    name: str = ""
    markers: tuple[str, ...] = ()  # text that opens the calls
    at_start_only: bool = False  # the calls are the whole answer (Llama 3): a marker later on is just text
    keeps_special_tokens: bool = False  # a marker is a special token: the answer's text must keep them

    def scan(self, text: str) -> list[PartialCall] | None:
        """The calls `text` (from the first marker on) holds so far, in order; each one's arguments only
        grow as `text` does. None: it holds no call (yet); if the answer ended so, it was plain text."""
        raise NotImplementedError
