"""llguidance and xgrammar on the same vocabulary and schemas: setup, compile time, mask time per token, coverage.

Coverage tries each schema of `COVERAGE_SCHEMAS` and, when it compiles, feeds the engine a document that breaks
only the keyword under test: an engine that accepts it dropped the keyword silently.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
from llguidance import LLMatcher

from quill.server.structured.grammar_source import JSON_OPTIONS

from .common.structured_vocab import COVERAGE_SCHEMAS, ORDER_EXAMPLE, ORDER_SCHEMA, llguidance_tokenizer

VIOLATIONS = {
    "minLength/maxLength": '"abcdefg"', "minimum/maximum (integer)": "9", "exclusiveMinimum (number)": "0",
    "multipleOf": "7", "pattern": '"abc"', "format: date-time": '"yesterday"', "uniqueItems": "[1,1]",
    "contains": "[2]", "$ref + $defs": '{"a":"x"}', "anyOf": '"abcd"', "oneOf": '"x"', "allOf": "{}",
    "patternProperties": '{"x-a":"s"}', "propertyNames": '{"abcd":1}', "minProperties": "{}",
    "dependentRequired": '{"a":1}', "if/then/else": '{"a":1}', "not": '"s"',
    "unevaluatedProperties": '{"a":1,"b":2}',
}


class Llguidance:
    name = "llguidance"

    def __init__(self, tokens: list[bytes]):
        start = time.perf_counter()
        self.tokenizer, self.vocabulary = llguidance_tokenizer(tokens)
        self.setup_s = time.perf_counter() - start
        self.eos = len(tokens) - 1
        self.words = (len(tokens) + 31) // 32

    def compile(self, schema: dict):
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def accepts(self, matcher, text: str) -> bool:
        return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()  # ids 0-255: single bytes

    def mask_times(self, matcher, ids: list[int]) -> list[float]:
        mask = torch.zeros(self.words, dtype=torch.int32)
        times = []
        for token in ids:
            start = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(mask.data_ptr(), self.words * 4)
            times.append(time.perf_counter() - start)
            assert matcher.consume_token(token), matcher.get_error()
        return times


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokens: list[bytes]):
        import xgrammar

        self.xgr = xgrammar
        start = time.perf_counter()
        self.info = xgrammar.TokenizerInfo(tokens, xgrammar.VocabType.RAW, stop_token_ids=[len(tokens) - 1])
        self.setup_s = time.perf_counter() - start
        self.eos = len(tokens) - 1
        self.vocab_size = len(tokens)

    def compile(self, schema: dict):
        compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)  # a fresh compile every time
        return self.xgr.GrammarMatcher(compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":")))

    def accepts(self, matcher, text: str) -> bool:
        return all(matcher.accept_token(b) for b in text.encode()) and matcher.accept_token(self.eos)

    def mask_times(self, matcher, ids: list[int]) -> list[float]:
        mask = self.xgr.allocate_token_bitmask(1, self.vocab_size)
        times = []
        for token in ids:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            times.append(time.perf_counter() - start)
            assert matcher.accept_token(token)
        return times


def available_engines() -> list[type]:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return [Llguidance]
    return [Llguidance, Xgrammar]


def compare(tokens: list[bytes], coverage: bool, repeats: int = 3) -> dict:
    """Each engine on `tokens`: setup, the order schema's compile and per-token mask times, and coverage."""
    out = {}
    for engine_class in available_engines():
        engine = engine_class(tokens)
        compiles = []
        for _ in range(repeats):
            start = time.perf_counter()
            engine.compile(ORDER_SCHEMA)
            compiles.append(time.perf_counter() - start)
        ids = llguidance_tokenizer(tokens)[1](ORDER_EXAMPLE)
        masks = engine.mask_times(engine.compile(ORDER_SCHEMA), ids)
        result = {"setup_s": engine.setup_s, "compile_s_median": statistics.median(compiles),
                  "mask_us_median": statistics.median(masks) * 1e6,
                  "mask_us_p90": sorted(masks)[int(0.9 * len(masks))] * 1e6, "mask_us_max": max(masks) * 1e6,
                  "tokens_walked": len(ids)}
        if coverage:
            result["coverage"] = {name: _coverage(engine, name, schema) for name, schema in COVERAGE_SCHEMAS.items()}
        out[engine.name] = result
    return out


def _coverage(engine, name: str, schema: dict) -> str:
    try:
        matcher = engine.compile(schema)
    except Exception as e:  # each engine raises its own kind
        return "refused: " + " ".join(str(e).split())[:90]
    violation = VIOLATIONS.get(name)
    if violation is not None and engine.accepts(matcher, violation):
        return f"IGNORED (accepted {violation})"
    return "enforced"


if __name__ == "__main__":
    from .common.structured_vocab import synthetic_vocab

    print(json.dumps(compare(synthetic_vocab(32_000), coverage=True), indent=1))
