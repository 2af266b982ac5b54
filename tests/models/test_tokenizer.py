"""Incremental detokenization: deltas add up to decode(prompt + output) minus decode(prompt), exactly,
over a byte-level (GPT-2) and a Metaspace (SentencePiece, Llama/Mistral) tokenizer; no character is split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from quill.models.text.tokenizer import CONTEXT_TOKENS, IncrementalDecoder, Tokenizer, context_ids
from tests.conftest import build_hf_tokenizer, build_metaspace_tokenizer

TOKENIZERS = {
    "bytelevel": lambda: Tokenizer(build_hf_tokenizer(), eos_token_id=0),
    "metaspace": lambda: Tokenizer(build_metaspace_tokenizer(), eos_token_id=2),
}
SPECIAL = {"bytelevel": "<|endoftext|>", "metaspace": "<sep>"}
TEXTS = ["To be, or not to be, that is the question:", "héllo wörld 🎉 café 日本語", "  two  spaces\nand a line",
         "🎉🎉", "the mind<SPECIAL> to suffer", "<SPECIAL><SPECIAL>Or to take arms"]


@pytest.fixture(scope="module")
def both() -> dict[str, Tokenizer]:
    return {name: build() for name, build in TOKENIZERS.items()}


@pytest.fixture(params=list(TOKENIZERS))
def tokenizer(request, both) -> Tokenizer:
    tokenizer = both[request.param]
    tokenizer.special = SPECIAL[request.param]
    return tokenizer


def contract(tokenizer: Tokenizer, prompt: list[int], output: list[int], skip: bool = True) -> str:
    """What the completion text must be."""
    full = tokenizer.decode(prompt + output, skip)
    return full[len(tokenizer.decode(prompt, skip)) :]


def deltas(tokenizer: Tokenizer, prompt: list[int], output: list[int], skip: bool = True) -> list[str]:
    decoder = IncrementalDecoder(tokenizer, prompt, skip)
    return [decoder.push(t) for t in output] + [decoder.flush()]


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text.replace("<SPECIAL>", tokenizer.special))


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "keep"])
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_prompt_continuation_at_every_cut(tokenizer, text, skip):
    ids = encode(tokenizer, text)
    for cut in range(len(ids)):
        prompt, output = ids[:cut], ids[cut:]
        got = deltas(tokenizer, prompt, output, skip)
        assert "".join(got) == contract(tokenizer, prompt, output, skip), (cut, got)
        assert tokenizer.decode_continuation(prompt, output, skip) == "".join(got)
        if "\ufffd" not in tokenizer.decode(ids, skip) and "\ufffd" not in tokenizer.decode(prompt, skip):
            assert not any("\ufffd" in d for d in got), got  # a split character is held back, never shown


def test_first_generated_token_keeps_its_metaspace_space():
    tokenizer = TOKENIZERS["metaspace"]()
    ids = tokenizer.encode("To be, or not to")
    cut = [tokenizer.id_to_token(i) for i in ids].index("▁not")
    prompt, output = ids[:cut], ids[cut:]
    assert deltas(tokenizer, prompt, output) == [" not", " to", ""]
    assert deltas(tokenizer, [], output)[0] == "not"  # decoding the output alone drops the space


def test_special_tokens_are_skipped_or_shown(tokenizer):
    prompt = encode(tokenizer, "To be, or not")
    output = encode(tokenizer, "<SPECIAL> to be")
    assert tokenizer.special not in "".join(deltas(tokenizer, prompt, output, skip=True))
    shown = "".join(deltas(tokenizer, prompt, output, skip=False))
    assert shown.startswith(tokenizer.special) and shown == contract(tokenizer, prompt, output, skip=False)


def test_metaspace_prompt_of_only_special_tokens():
    tokenizer = TOKENIZERS["metaspace"]()
    prompt, output = [1], tokenizer.encode("To be")  # <s>, then the text
    assert "".join(deltas(tokenizer, prompt, output, skip=True)) == "To be"  # as decode(<s> To be) shows it
    assert "".join(deltas(tokenizer, prompt, output, skip=False)) == " To be"  # after "<s>": a word, so a space


def test_split_character_is_held_back_until_complete():
    tokenizer = TOKENIZERS["bytelevel"]()
    prompt = tokenizer.encode("a party")
    output = tokenizer.encode(" 🎉")
    assert len(output) > 2  # byte-level: the emoji's four bytes are tokens of their own
    got = deltas(tokenizer, prompt, output)
    assert got[:-2] == [" "] + [""] * (len(output) - 2) and got[-2:] == ["🎉", ""]


def test_character_cut_at_the_end_is_flushed_as_decode_shows_it():
    tokenizer = TOKENIZERS["bytelevel"]()
    prompt, output = tokenizer.encode("a party"), tokenizer.encode(" 🎉")[:-1]
    got = deltas(tokenizer, prompt, output)
    assert got[-1] == "\ufffd" and "".join(got) == contract(tokenizer, prompt, output) == " \ufffd"


def test_prompt_ending_mid_character_gives_what_the_subtraction_gives():
    tokenizer = TOKENIZERS["bytelevel"]()
    ids = tokenizer.encode("ab🎉cd")
    for cut in range(3, len(ids)):  # token ids as a prompt can end inside the emoji
        prompt, output = ids[:cut], ids[cut:]
        assert "".join(deltas(tokenizer, prompt, output)) == contract(tokenizer, prompt, output)


def test_only_the_tail_of_the_prompt_is_decoded_unless_it_shows_no_text():
    tokenizer = TOKENIZERS["metaspace"]()
    words = tokenizer.encode("To be, or not to be, that is the question")
    context, text = context_ids(tokenizer, words, skip_special_tokens=True)
    assert context == words[-CONTEXT_TOKENS:] and text
    prompt = words + [3] * (3 * CONTEXT_TOKENS)  # a tail of <sep>, which skipping hides
    context, text = context_ids(tokenizer, prompt, skip_special_tokens=True)
    assert len(context) > 3 * CONTEXT_TOKENS and text.endswith("question")
    output = tokenizer.encode("To be")
    assert "".join(deltas(tokenizer, prompt, output)) == contract(tokenizer, prompt, output) == " To be"


def test_a_decoder_that_rewrites_earlier_text_does_not_raise():
    """tokenizers' DecodeStream raises when a longer window's text does not extend the shorter one's;
    the decoder then slices text as TGI does instead of failing the engine's step."""

    class Ligature:  # "a" then "b" decode to one character
        def decode_chain(self, tokens):
            return ["".join(tokens).replace("ab", "X")]

    hf = HFTokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "c": 3}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.decoder = decoders.Decoder.custom(Ligature())
    decoder = IncrementalDecoder(Tokenizer(hf, None), [3])
    assert [decoder.push(t) for t in (1, 2, 3)] == ["a", "", "c"]
    assert decoder.flush() == ""


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(list(TOKENIZERS)),
    text=st.text(alphabet="ab ,.\n'éü🎉日", min_size=1, max_size=24),
    cut=st.integers(0, 40),
    specials=st.lists(st.integers(0, 40), max_size=3),
    skip=st.booleans(),
)
def test_deltas_add_up_for_any_text(both, name, text, cut, specials, skip):
    tokenizer = both[name]
    ids = tokenizer.encode(text)
    special = tokenizer.hf.token_to_id(SPECIAL[name])
    for at in specials:
        ids.insert(min(at, len(ids)), special)
    prompt, output = ids[: min(cut, len(ids) - 1)], ids[min(cut, len(ids) - 1) :]
    assert "".join(deltas(tokenizer, prompt, output, skip)) == contract(tokenizer, prompt, output, skip)


@pytest.mark.parametrize("text", TEXTS)
def test_peek_is_what_the_next_push_adds_without_pushing(tokenizer, text):
    """Peeking reads what pushing then adds (with any piece held back before it), and moves nothing; a token
    that leaves a character open adds "" when pushed and peeks as U+FFFD."""
    ids = encode(tokenizer, text)
    decoder = IncrementalDecoder(tokenizer, ids[:1], skip_special_tokens=False)
    for token_id in ids[1:]:
        peeked = decoder.peek([token_id, ids[0], token_id])
        assert peeked[0] == peeked[2]
        pushed = decoder.push(token_id)
        assert peeked[0] == pushed or (pushed == "" and peeked[0].endswith("\ufffd")), (peeked, pushed)
