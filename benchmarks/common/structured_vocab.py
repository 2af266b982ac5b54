"""Synthetic vocabularies of 32k and 128k tokens, and the schemas the structured-output benchmarks constrain with.

No 32k or 128k tokenizer ships with Quill and the benchmarks run offline, so a vocabulary is made up the way
BPE vocabularies look: the 256 single bytes, JSON's punctuation runs, and word-like pieces of 2-12 letters
(half with a leading space, some capitalized, some digits), plus one EOS. Mask cost depends on the vocabulary's
size and how its tokens share prefixes, which this reproduces; it is not any real model's tokenizer.
"""

from __future__ import annotations

import random
import string

from llguidance import LLTokenizer, TokenizerWrapper

JSON_PIECES = ['{"', '":', '",', '"}', ', "', '": "', '":"', '","', '"]', '["', '},{', '}]', '":[', '":{', '":"', '",[']

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{6}$"},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "email": {"type": "string", "format": "email"},
            "tier": {"enum": ["free", "pro", "enterprise"]}},
            "required": ["name", "email", "tier"], "additionalProperties": False},
        "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {
            "type": "object", "properties": {
                "sku": {"type": "string", "maxLength": 12},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                "price": {"type": "number", "minimum": 0}},
            "required": ["sku", "quantity", "price"], "additionalProperties": False}},
        "express": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 80},
    },
    "required": ["order_id", "customer", "items", "express", "note"],
    "additionalProperties": False,
}
ORDER_EXAMPLE = ('{"order_id":"AB-123456","customer":{"name":"Horatio of Denmark","email":"horatio@elsinore.dk",'
                 '"tier":"pro"},"items":[{"sku":"SKULL-1","quantity":2,"price":12.5},{"sku":"FOIL-7","quantity":1,'
                 '"price":40}],"express":true,"note":"Deliver to the castle gate before the ghost walks"}')

# Schemas that use keywords a grammar engine may implement, or not: coverage is which compile, which are
# refused naming the keyword, and which compile while the keyword is dropped (the silent case).
COVERAGE_SCHEMAS = {
    "order (nested, pattern, format, enum, array bounds)": ORDER_SCHEMA,
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "minimum/maximum (integer)": {"type": "integer", "minimum": 3, "maximum": 7},
    "exclusiveMinimum (number)": {"type": "number", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "pattern": {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"},
    "format: date-time": {"type": "string", "format": "date-time"},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "contains": {"type": "array", "contains": {"const": 1}},
    "$ref + $defs": {"$defs": {"p": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}},
                     "required": ["a"]},
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
    "patternProperties": {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}},
    "propertyNames": {"type": "object", "propertyNames": {"maxLength": 3}},
    "minProperties": {"type": "object", "minProperties": 2},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "if/then/else": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    "not": {"not": {"type": "string"}},
    "unevaluatedProperties": {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
}


def synthetic_vocab(size: int, seed: int = 0) -> list[bytes]:
    """`size` distinct tokens as bytes; the last one is EOS (b"\\xff<eos>", special)."""
    rng = random.Random(seed)
    tokens = [bytes([b]) for b in range(256)] + [p.encode() for p in JSON_PIECES]
    seen = set(tokens)
    letters = string.ascii_lowercase
    while len(tokens) < size - 1:
        length = min(12, max(2, int(rng.expovariate(1 / 4.5)) + 2))
        word = "".join(rng.choice(letters) for _ in range(length))
        roll = rng.random()
        if roll < 0.1:
            word = word.capitalize()
        elif roll < 0.15:
            word = "".join(rng.choice(string.digits) for _ in range(min(length, 4)))
        piece = (" " + word if rng.random() < 0.5 else word).encode()
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
    return tokens + [b"\xff<eos>"]


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads, for a synthetic vocabulary; tokenizes by greedy longest match."""

    def __init__(self, tokens: list[bytes]):
        self.tokens = tokens
        self.eos_token_id = len(tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = [self.eos_token_id]
        self._ids = {t: i for i, t in enumerate(tokens[:-1])}
        self._longest = max(map(len, tokens))

    def __call__(self, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        ids, i = [], 0
        while i < len(data):
            size = next(s for s in range(min(self._longest, len(data) - i), 0, -1) if data[i:i + s] in self._ids)
            ids.append(self._ids[data[i:i + size]])
            i += size
        return ids


def llguidance_tokenizer(tokens: list[bytes]) -> tuple[LLTokenizer, _Vocabulary]:
    vocabulary = _Vocabulary(tokens)
    return LLTokenizer(TokenizerWrapper(vocabulary)), vocabulary
