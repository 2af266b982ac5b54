"""A request's constraint (`StructuredOutput`) as llguidance grammar text, with its mistakes reported by name."""

from __future__ import annotations

import json

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from .constraint import StructuredOutput

# No free whitespace between JSON tokens: a model drifting into spaces or newlines could otherwise spend its
# whole max_tokens there (the issue users report of other servers). Separators are the compact ones.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":", "lenient": False}


class GrammarError(ValueError):
    """A constraint that cannot be used as it is: `str()` says what was rejected (a keyword, a syntax error)."""


def grammar_text(structured: StructuredOutput) -> str:
    """llguidance's grammar for the constraint (not yet checked: `GrammarCompiler` compiles and checks it)."""
    kind, spec = structured.kind, structured.spec
    if kind == "json_schema":
        try:
            schema = json.loads(spec)
        except ValueError as e:
            raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema is an object or true, not {json.dumps(schema)[:40]}")
        return LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        choices = json.loads(spec)
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    if kind == "grammar":
        try:
            return LLMatcher.grammar_from_lark(any_to_lark(spec))
        except Exception as e:  # the GBNF translator raises what its parser raises
            raise GrammarError(f"the grammar could not be read: {e}") from None
    raise GrammarError(f"unknown constraint kind {kind!r}")
