"""Hermes' format, which Qwen 2.5 and 3 use: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
one block per call, text allowed before them."""

from __future__ import annotations

import json

from .calls import ToolCall, call_from_json
from .format import ToolCallFormat

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _call(block: str) -> ToolCall | None:
    try:
        return call_from_json(json.loads(block))
    except ValueError:
        return None


class HermesFormat(ToolCallFormat):
    name = "hermes"
    markers = (OPEN,)

    def complete_calls(self, text: str) -> list[ToolCall]:
        calls = []
        for block in text.split(OPEN)[1:]:
            body, closed, _ = block.partition(CLOSE)
            call = _call(body) if closed else None
            if call is None:
                break
            calls.append(call)
        return calls

    def calls(self, text: str) -> list[ToolCall] | None:
        calls = []
        for block in text.split(OPEN)[1:]:
            call = _call(block.partition(CLOSE)[0])  # the last block may be cut off where the answer stopped
            if call is None:
                break
            calls.append(call)
        return calls or None
