"""Llama 3.1-3.3's JSON tool calls: the whole answer is `{"name": ..., "parameters": {...}}` (several
joined by `;`), possibly after `<|python_tag|>`."""

from __future__ import annotations

from .calls import PartialCall, object_calls
from .format import ToolCallFormat

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"
    markers = (PYTHON_TAG, "{")
    at_start_only = True
    keeps_special_tokens = True  # <|python_tag|> is one

    def scan(self, text: str) -> list[PartialCall] | None:
        body = text.lstrip()
        calls, _ = object_calls(body, len(PYTHON_TAG) if body.startswith(PYTHON_TAG) else 0, ";")
        return calls or None
