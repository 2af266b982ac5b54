"""Constrained decoding with llguidance: compiling a request's constraint, and a matcher per sequence.

llguidance was chosen over xgrammar (benchmarks/README.md, "Structured outputs"): it refuses a JSON schema
keyword it does not implement, naming it, where xgrammar ignores some silently; it compiles a schema lazily
(no per-vocabulary precomputation, so a new schema costs about a millisecond) and computes a mask in tens of
microseconds per token.
"""

from .compiler import GrammarCompiler
from .grammar_source import GrammarError
from .matcher import GrammarMatcher, fill_bitmasks

__all__ = ["GrammarCompiler", "GrammarError", "GrammarMatcher", "fill_bitmasks"]
