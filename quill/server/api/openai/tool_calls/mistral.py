"""Mistral's tool calls, after the special token `[TOOL_CALLS]`: a JSON list `[{"name": ..., "arguments":
{...}}, ...]` (tokenizers before v11), or `name[ARGS]{...}` per call, each after its own `[TOOL_CALLS]` (v11 on)."""

from __future__ import annotations

from .calls import PartialCall, arguments_call, listed_calls, skip
from .format import ToolCallFormat

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def _named(part: str) -> PartialCall | None:
    name, sep, rest = part.partition(ARGS)
    if not sep or not name.strip():
        return None
    call = arguments_call(name.strip(), rest, skip(rest, 0))
    if call is not None and call.end is not None:
        call.end += len(name) + len(ARGS)
    return call


class MistralFormat(ToolCallFormat):
    name = "mistral"
    markers = (TOOL_CALLS,)
    keeps_special_tokens = True

    def scan(self, text: str) -> list[PartialCall] | None:
        parts = text.split(TOOL_CALLS)[1:]
        if len(parts) == 1 and parts[0].lstrip().startswith("["):
            return listed_calls(parts[0], 0)
        calls = []
        for part in parts:
            call = _named(part)
            if call is None:
                break
            calls.append(call)
            if call.end is None:
                break
        return calls or None
