"""`tool_choice` "required" or a named function: the answer is held to a JSON schema by constrained decoding,
so it is always a call (or several) of the listed functions with arguments their schemas accept.

As vLLM does: for a named function the answer is its arguments object; for "required" it is a list of
`{"name": ..., "parameters": {...}}`, each name one of the tools' and its parameters that tool's schema,
at least one. The formats below read those answers as calls.
"""

from __future__ import annotations

import json

from .calls import ToolCall, call_from_json, json_values
from .format import ToolCallFormat

EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # a function that declares none takes an empty object


def parameters_schema(function: dict) -> dict:
    return function.get("parameters") or EMPTY_PARAMETERS


def required_schema(functions: list[dict]) -> dict:
    """The answers `tool_choice: "required"` allows: one or more calls of `functions` (OpenAI's function objects)."""
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [f["name"]]}, "parameters": parameters_schema(f)},
              "required": ["name", "parameters"]}
             for f in functions]
    return {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}


def named_schema(function: dict) -> dict:
    """The answers a named tool_choice allows: that function's arguments."""
    return parameters_schema(function)


class RequiredFormat(ToolCallFormat):
    """The answer is a JSON list of calls, from its first character."""

    name = "required"
    markers = ("[",)
    at_start_only = True

    def calls(self, text: str) -> list[ToolCall] | None:
        values, rest = json_values(text)
        if len(values) != 1 or not isinstance(values[0], list) or rest.strip():
            return None
        calls = [call_from_json(v, ("parameters", "arguments")) for v in values[0]]
        return None if not calls or None in calls else calls


class NamedFormat(ToolCallFormat):
    """The answer is the named function's arguments object."""

    markers = ("{",)
    at_start_only = True

    def __init__(self, function_name: str):
        self.function_name = function_name

    def calls(self, text: str) -> list[ToolCall] | None:
        values, rest = json_values(text)
        if len(values) != 1 or not isinstance(values[0], dict) or rest.strip():
            return None
        return [ToolCall(self.function_name, json.dumps(values[0], ensure_ascii=False))]
