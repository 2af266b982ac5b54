"""What a tool-call format makes of a model's answer: the calls it holds, and the text beside them."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's function.arguments
    id: str = field(default_factory=new_call_id)

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def call_from_json(obj, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | None:
    """{"name": ..., "arguments" | "parameters": {...}} (as the model wrote it) -> a call; None if it is not one.
    Arguments given as a JSON string are taken as that object's text."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = next((k for k in argument_keys if k in obj), None)
    arguments = {} if key is None else obj[key]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def json_values(text: str) -> tuple[list, str]:
    """The JSON values at the start of `text`, one after another (whitespace, `,` or `;` between them), and
    what follows the last one."""
    decoder = json.JSONDecoder()
    values, at = [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n,;":
            at += 1
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return values, text[at:]
        values.append(value)
