"""Hermes' format, which Qwen 2.5 and 3 use: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
one block per call, text allowed before them."""

from __future__ import annotations

from .calls import PartialCall, object_calls
from .format import ToolCallFormat

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(ToolCallFormat):
    name = "hermes"
    markers = (OPEN,)

    def scan(self, text: str) -> list[PartialCall] | None:
        calls = []
        for block in text.split(OPEN)[1:]:
            body = block.partition(CLOSE)[0]  # the last block may be cut off where the answer stopped
            found, _ = object_calls(body, 0, "")
            if not found:
                break
            calls.append(found[0])
            if found[0].end is None:
                break
        return calls or None
