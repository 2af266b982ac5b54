"""Tool calls as they are read from an answer's text, whole or still arriving.

Models write a call as a JSON object with the name first (`{"name": ..., "arguments": {...}}`), so the
name is known before the arguments and the arguments' text can go out as it arrives: a call's arguments
are the text the model wrote, unchanged, and only ever grow. An object written another way (arguments
first, or as a JSON string) is read when it is whole.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

ARGUMENT_KEYS = ("arguments", "parameters")
# `{"name": "...", "arguments": ` -- the name closed, the arguments' value about to begin.
_NAME_FIRST = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"([a-z]+)"\s*:\s*')


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's function.arguments
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class PartialCall:
    """A call read so far: its name, its arguments' text so far, and where its text ends once whole."""

    name: str
    arguments: str
    end: int | None = None  # just past the call's text; None: more of it is to come


def skip(text: str, at: int, chars: str = " \t\r\n") -> int:
    while at < len(text) and text[at] in chars:
        at += 1
    return at


# A JSON string (group 1 is its closing quote, empty while it is open) or a bracket: all value_end needs to
# see, matched in C. A call's text is scanned again whole as each piece arrives: over a 16k-character call
# pushed 4 characters at a time, stepping through it a character at a time in Python took 1.2 s, this 0.3 s
# (0.02 s at 4k characters).
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*("?)|[{}\[\]]')


def value_end(text: str, at: int) -> int | None:
    """Just past the JSON object, list or string that begins at text[at]; None while it is not closed."""
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(text, at):
        token = match.group()
        if token[0] == '"':
            if not match.group(1):
                return None
            if depth == 0:
                return match.end()
        elif token in "{[":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return match.end()
    return None


def json_object_text(text: str) -> str | None:
    """`text` if it is a JSON object; a JSON string holding one, that object's text; else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, str):
        return json_object_text(value)
    return text if isinstance(value, dict) else None


def arguments_call(name: str, text: str, at: int) -> PartialCall | None:
    """A call of `name` whose arguments' value begins at text[at] (or is yet to). An object streams as it
    arrives; a JSON string holding one goes out whole, as that object's text. None: no arguments."""
    if at == len(text):
        return PartialCall(name, "")
    if text[at] not in '{"':
        return None
    end = value_end(text, at)
    if text[at] == '"':
        if end is None:
            return PartialCall(name, "")
        arguments = json_object_text(text[at:end])
        return None if arguments is None else PartialCall(name, arguments, end)
    if end is None:
        return PartialCall(name, text[at:])
    return PartialCall(name, text[at:end], end) if json_object_text(text[at:end]) is not None else None


def object_call(text: str, at: int, argument_keys: tuple[str, ...] = ARGUMENT_KEYS) -> PartialCall | None:
    """The call written as a JSON object at text[at] with its name first; its `end` is past the object's
    closing brace. None: not (yet) readable so."""
    match = _NAME_FIRST.match(text, at)
    if match is None or match.group(2) not in argument_keys:
        return None
    call = arguments_call(json.loads(f'"{match.group(1)}"'), text, match.end())
    if call is None or call.end is None:
        return call
    close = skip(text, call.end)
    if close == len(text):  # the object's closing brace is yet to come
        return PartialCall(call.name, call.arguments)
    if text[close] == "}":
        return PartialCall(call.name, call.arguments, close + 1)
    if text[close] != ",":
        return None
    # More keys after the arguments (Mistral's models may write an "id"): the call ends with the object.
    end = value_end(text, at)
    if end is not None:
        try:
            json.loads(text[at:end])
        except ValueError:
            return None
    return PartialCall(call.name, call.arguments, end)


def whole_call(obj, argument_keys: tuple[str, ...] = ARGUMENT_KEYS) -> PartialCall | None:
    """A call from a parsed JSON object written any way: {"name": ..., "arguments" | "parameters": {...}}."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = next((k for k in argument_keys if k in obj), None)
    arguments = {} if key is None else obj[key]
    if isinstance(arguments, str):
        text = json_object_text(arguments)
        return None if text is None else PartialCall(obj["name"], text)
    return PartialCall(obj["name"], json.dumps(arguments, ensure_ascii=False)) if isinstance(arguments, dict) else None


def object_calls(text: str, at: int, separators: str, closing: str = "",
                 argument_keys: tuple[str, ...] = ARGUMENT_KEYS) -> tuple[list[PartialCall], int]:
    """Call objects one after another from text[at], `separators` (and blanks) between them, up to `closing`
    (if any); returns them and where reading stopped. An object not written name first is read once whole."""
    calls = []
    while True:
        at = skip(text, at, " \t\r\n" + separators)
        if at == len(text) or (closing and text.startswith(closing, at)):
            return calls, at
        call = object_call(text, at, argument_keys)
        if call is None:  # written another way: whole, or not a call
            end = value_end(text, at) if text[at] == "{" else None
            if end is None:
                return calls, at
            try:
                call = whole_call(json.loads(text[at:end]), argument_keys)
            except ValueError:
                call = None
            if call is None:
                return calls, at
            call.end = end
        calls.append(call)
        if call.end is None:
            return calls, at
        at = call.end


def listed_calls(text: str, at: int, argument_keys: tuple[str, ...] = ARGUMENT_KEYS) -> list[PartialCall] | None:
    """Calls in a JSON list that begins at text[at] (or is yet to)."""
    at = skip(text, at)
    if at == len(text) or text[at] != "[":
        return None
    calls, _ = object_calls(text, at + 1, ",", "]", argument_keys)
    return calls or None
