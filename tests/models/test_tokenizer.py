"""Incremental detokenization never splits a character and adds up to the full text."""

from __future__ import annotations

import pytest

from models.tokenizer import IncrementalDecoder


@pytest.mark.parametrize("text", ["plain ascii words", "héllo wörld 🎉 café 日本語", "🎉🎉🎉", "a\u0301e\u0301 combining"])
def test_deltas_concatenate_to_the_decoded_text(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text)
    decoder = IncrementalDecoder(tiny_tokenizer)
    deltas = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(deltas) == tiny_tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_incomplete_character_at_the_end_is_flushed(tiny_tokenizer):
    ids = tiny_tokenizer.encode("🎉")
    assert len(ids) > 1  # byte-level: the emoji spans several tokens
    decoder = IncrementalDecoder(tiny_tokenizer)
    assert [decoder.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.flush() == tiny_tokenizer.decode(ids[:-1])
