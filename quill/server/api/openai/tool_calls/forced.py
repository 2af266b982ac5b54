"""`tool_choice` "required" or a named function: the answer is held to a JSON schema by constrained decoding,
so it is always a call (or several) of the listed functions with arguments their schemas accept.

As vLLM does: for a named function the answer is its arguments object; for "required" it is a list of
`{"name": ..., "parameters": {...}}`, each name one of the tools' and its parameters that tool's schema,
at least one. The formats below read those answers as calls.
"""

from __future__ import annotations

from .calls import PartialCall, arguments_call, listed_calls, skip
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

    def scan(self, text: str) -> list[PartialCall] | None:
        return listed_calls(text, 0, ("parameters", "arguments"))


class NamedFormat(ToolCallFormat):
    """The answer is the named function's arguments object."""

    markers = ("{",)
    at_start_only = True

    def __init__(self, function_name: str):
        self.name = self.function_name = function_name

    def scan(self, text: str) -> list[PartialCall] | None:
        at = skip(text, 0)
        if at == len(text) or text[at] != "{":
            return None
        call = arguments_call(self.function_name, text, at)
        return None if call is None else [call]
