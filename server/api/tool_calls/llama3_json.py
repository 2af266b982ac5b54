"""Llama 3.1-3.3's JSON tool calls: the whole answer is `{"name": ..., "parameters": {...}}` (several
joined by `;`), possibly after `<|python_tag|>`."""

from __future__ import annotations

from .calls import ToolCall, call_from_json, json_values
from .format import ToolCallFormat

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"
    markers = (PYTHON_TAG, "{")
    at_start_only = True
    keeps_special_tokens = True  # <|python_tag|> is one

    def calls(self, text: str) -> list[ToolCall] | None:
        values, rest = json_values(text.removeprefix(PYTHON_TAG))
        calls = [call_from_json(v) for v in values]
        if not calls or None in calls or rest.strip():
            return None
        return calls
