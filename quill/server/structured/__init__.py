"""Structured output: what a request's answer must match (constraint.py: a JSON schema, a regex, a choice, a
grammar), compiled with llguidance (compiler.py, grammar_source.py, tokenizer_info.py), and a matcher per sequence
(matcher.py). The HTTP side reads the dialects' fields (api/structured_fields.py) and serves the playground's
token tips (api/structured_routes.py); the engine fills each step's masks (engine/grammar_masks.py).

llguidance was chosen over xgrammar (benchmarks/README.md, "Structured outputs"): it refuses a JSON schema
keyword it does not implement, naming it, where xgrammar ignores some silently; it compiles a schema lazily
(no per-vocabulary precomputation, so a new schema costs about a millisecond) and computes a mask in tens of
microseconds per token.
"""

from .compiler import GrammarCompiler
from .grammar_source import GrammarError
from .matcher import GrammarMatcher, fill_bitmasks

__all__ = ["GrammarCompiler", "GrammarError", "GrammarMatcher", "fill_bitmasks"]
