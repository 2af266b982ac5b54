"""The tool-call formats by name (`quill serve --tool-call-parser NAME`), and the one a checkpoint's chat
template writes, found by the markers it teaches the model."""

from __future__ import annotations

from .format import ToolCallFormat
from .hermes import HermesFormat
from .llama3_json import PYTHON_TAG, Llama3JsonFormat
from .mistral import TOOL_CALLS, MistralFormat

TOOL_CALL_FORMATS: dict[str, type[ToolCallFormat]] = {
    HermesFormat.name: HermesFormat,
    Llama3JsonFormat.name: Llama3JsonFormat,
    MistralFormat.name: MistralFormat,
}

# What in a chat template (or its special tokens) shows which format its model writes, first match wins.
# Llama 3's templates name <|python_tag|> only for built-in tools; their JSON calls are shown as
# {"name": ..., "parameters": ...} after an ipython-role turn.
EVIDENCE = (
    ("hermes", ("<tool_call>",)),
    ("mistral", (TOOL_CALLS,)),
    ("llama3_json", (PYTHON_TAG, "<|start_header_id|>ipython", '"parameters": ')),
)


def tool_call_format(name: str) -> ToolCallFormat:
    if name not in TOOL_CALL_FORMATS:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(TOOL_CALL_FORMATS)})")
    return TOOL_CALL_FORMATS[name]()


def detect_format(template_source: str | None, vocabulary: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The format a checkpoint's model writes calls in, from its chat template and its tokens; None if unknown."""
    if not template_source:
        return None
    for name, evidence in EVIDENCE:
        if any(e in template_source for e in evidence):
            return name
    if TOOL_CALLS in vocabulary and "tools" in template_source:
        return "mistral"
    return None
