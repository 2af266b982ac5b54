"""Mistral's tool calls, after the special token `[TOOL_CALLS]`: a JSON list `[{"name": ..., "arguments":
{...}}, ...]` (tokenizers before v11), or `name[ARGS]{...}` per call, each after its own `[TOOL_CALLS]` (v11 on)."""

from __future__ import annotations

from .calls import ToolCall, call_from_json, json_values
from .format import ToolCallFormat

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def _listed(text: str) -> list[ToolCall] | None:
    values, rest = json_values(text)
    if len(values) != 1 or not isinstance(values[0], list) or rest.strip():
        return None
    calls = [call_from_json(v) for v in values[0]]
    return None if not calls or None in calls else calls


def _named(part: str) -> ToolCall | None:
    name, sep, arguments = part.partition(ARGS)
    if not sep or not name.strip():
        return None
    values, rest = json_values(arguments)
    if len(values) != 1 or rest.strip():
        return None
    return call_from_json({"name": name.strip(), "arguments": values[0]})


class MistralFormat(ToolCallFormat):
    name = "mistral"
    markers = (TOOL_CALLS,)
    keeps_special_tokens = True

    def calls(self, text: str) -> list[ToolCall] | None:
        parts = [p for p in text.split(TOOL_CALLS)[1:]]
        if len(parts) == 1 and parts[0].lstrip().startswith("["):
            return _listed(parts[0])
        calls = [_named(p) for p in parts]
        return None if not calls or None in calls else calls
