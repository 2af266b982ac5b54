"""Compiling constraints for every kind of tokenizer Quill serves; refusals that name what was refused."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import torch

from quill.models.classic.word_tokenizer import word_tokenizer
from quill.models.text.tokenizer import Tokenizer
from quill.server.sampling import StructuredOutput
from quill.server.structured import GrammarCompiler, GrammarError
from quill.server.structured.matcher import bitmask_words
from tests.conftest import build_metaspace_tokenizer


def greedy_walk(compiler: GrammarCompiler, tokenizer: Tokenizer, structured: StructuredOutput, limit: int = 60) -> str:
    """Follow the grammar taking the allowed token with the longest text (EOS last): the output it forces."""
    matcher = compiler.matcher(structured)
    ids = []
    bitmask = torch.zeros(1, bitmask_words(compiler.vocab_size), dtype=torch.int32)
    for _ in range(limit):
        if matcher.is_done:
            break
        matcher.fill(bitmask, 0)
        bits = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()
        allowed = bits[: compiler.vocab_size].nonzero().flatten().tolist()
        assert allowed, "a grammar that is not done allows some token"
        texts = {t: tokenizer.decode(ids + [t]) for t in allowed}
        token = max(allowed, key=lambda t: (len(texts[t]), -t))
        if texts[token] == tokenizer.decode(ids) and matcher.is_accepting:
            break
        assert matcher.consume(token)
        ids.append(token)
    return tokenizer.decode(ids)


@pytest.fixture(params=["byte_level", "metaspace"])
def tokenizer(request, tiny_tokenizer) -> Tokenizer:
    if request.param == "byte_level":
        return tiny_tokenizer
    return Tokenizer(build_metaspace_tokenizer(), eos_token_id=2)


def test_choice_is_reachable_with_every_tokenizer(tokenizer):
    compiler = GrammarCompiler(tokenizer, [tokenizer.eos_token_id], tokenizer.vocab_size)
    text = greedy_walk(compiler, tokenizer, StructuredOutput.choice(["yes", "no"]))
    assert text in ("yes", "no")


def test_word_level_tokenizers_are_refused_with_a_reason():
    words = word_tokenizer(["<unk>", "</s>", "yes", "no"], unk_token="<unk>", eos_token="</s>")
    compiler = GrammarCompiler(words, [], words.vocab_size)
    with pytest.raises(GrammarError, match="word-level"):
        compiler.compile(StructuredOutput.choice(["yes", "no"]))


def test_json_schema_without_free_whitespace(tiny_tokenizer):
    compiler = GrammarCompiler(tiny_tokenizer, [0], tiny_tokenizer.vocab_size + 3)  # an output layer wider than the vocabulary
    schema = {"type": "object", "properties": {"k": {"enum": ["x", "y"]}}, "required": ["k"],
              "additionalProperties": False}
    text = greedy_walk(compiler, tiny_tokenizer, StructuredOutput.json_schema(schema))
    assert json.loads(text)["k"] in ("x", "y"), text
    assert " " not in text


def test_metaspace_pieces_spell_spaces():
    tokenizer = Tokenizer(build_metaspace_tokenizer(), eos_token_id=2)  # its few pieces have no "{": no JSON here
    compiler = GrammarCompiler(tokenizer, [2], tokenizer.vocab_size + 3)
    text = greedy_walk(compiler, tokenizer, StructuredOutput("regex", "(the|no) (be,|to)"))
    assert re.fullmatch("(the|no) (be,|to)", text), text


def test_refusals_name_the_keyword_or_the_mistake(tiny_tokenizer):
    compiler = GrammarCompiler(tiny_tokenizer, [0], tiny_tokenizer.vocab_size)
    with pytest.raises(GrammarError, match="unevaluatedProperties"):
        compiler.compile(StructuredOutput.json_schema({"type": "object", "unevaluatedProperties": False}))
    with pytest.raises(GrammarError, match="not valid JSON"):
        compiler.compile(StructuredOutput("json_schema", "{nope"))
    with pytest.raises(GrammarError, match="regex"):
        compiler.compile(StructuredOutput("regex", "a(b"))
    with pytest.raises(GrammarError, match="foo"):
        compiler.compile(StructuredOutput("grammar", "start: foo"))


def test_compiles_are_cached_and_timed(tiny_tokenizer):
    compiler = GrammarCompiler(tiny_tokenizer, [0], tiny_tokenizer.vocab_size)
    structured = StructuredOutput("regex", "[0-9]+")
    asyncio.run(compiler.check(structured))
    assert compiler.compile(structured) is compiler.compile(structured)
    assert re.fullmatch("[0-9]+", greedy_walk(compiler, tiny_tokenizer, structured, limit=5))


def test_a_compile_past_its_time_is_refused_and_stays_refused(tiny_tokenizer):
    compiler = GrammarCompiler(tiny_tokenizer, [0], tiny_tokenizer.vocab_size, timeout_s=0.0)
    structured = StructuredOutput.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    with pytest.raises(GrammarError, match="longer than"):
        asyncio.run(compiler.check(structured))
    with pytest.raises(GrammarError, match="longer than"):
        compiler.compile(structured)
