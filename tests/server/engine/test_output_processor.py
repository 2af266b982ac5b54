"""Tokens in, client deltas out: text, held-back stop strings, finish reasons, who gets freed."""

from __future__ import annotations

from quill.server.engine.output_processor import OutputProcessor
from quill.server.engine.sequence import Sequence, SequenceGroup
from quill.server.sampling import SamplingParams


def new_request(processor, tokenizer, prompt_text: str, **params):
    prompt = tokenizer.encode(prompt_text)
    group = SequenceGroup("r", prompt, SamplingParams(**params))
    seq = Sequence(0, group, list(prompt), len(prompt))
    processor.start(seq)
    group.seqs.append(seq)
    return group, seq


def feed(processor, group, seq, text: str):
    """Append the tokens of `text` one by one, collecting the request's outputs after each."""
    outputs, freed = [], []
    for token in processor.tokenizer.encode(text):
        if seq.is_finished:
            break
        processor.append(seq, token, -0.5, None)
        out, finished = processor.collect(group)
        freed += finished
        if out is not None:
            outputs.append(out)
    return outputs, freed


def test_deltas_concatenate_to_the_text_and_the_last_one_finishes(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, [0])
    group, seq = new_request(processor, tiny_tokenizer, "To be", max_tokens=50)
    outputs, freed = feed(processor, group, seq, ", or not to be")
    text = "".join(c.text for out in outputs for c in out.outputs)
    assert text == ", or not to be"
    assert not any(out.finished for out in outputs) and freed == []
    assert outputs[0].prompt_logprobs is None and all(c.logprobs is None for o in outputs for c in o.outputs)
    assert outputs[-1].outputs[0].cumulative_logprob == -0.5 * len(tiny_tokenizer.encode(", or not to be"))


def test_stop_string_is_held_back_then_cut(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, [0])
    group, seq = new_request(processor, tiny_tokenizer, "To be", max_tokens=50, stop=["not"])
    outputs, freed = feed(processor, group, seq, ", or not to be")
    streamed = "".join(c.text for out in outputs for c in out.outputs)
    assert streamed == ", or "
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "stop"
    assert freed == [seq] and group.seqs == [] and group.finished_seqs == [seq]


def test_length_limit_finishes_with_every_token(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, [0])
    group, seq = new_request(processor, tiny_tokenizer, "To be", max_tokens=2)
    outputs, freed = feed(processor, group, seq, ", or not to be")
    assert sum(len(c.token_ids) for o in outputs for c in o.outputs) == 2
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length" and freed == [seq]


def test_failed_request_reports_every_output(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, [0])
    group, _ = new_request(processor, tiny_tokenizer, "To be", n=3)
    out = processor.failed(group, "boom")
    assert out.finished and out.error == "boom"
    assert [c.finish_reason for c in out.outputs] == ["error"] * 3


def test_eos_after_half_a_character_keeps_what_decodes(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, [0])
    group, seq = new_request(processor, tiny_tokenizer, "To be", max_tokens=50)
    half = tiny_tokenizer.encode("é")[:1]  # byte-level: the first of the character's two bytes
    for token in tiny_tokenizer.encode(" or") + half + [0]:
        processor.append(seq, token, 0.0, None)
    out, freed = processor.collect(group)
    expected = tiny_tokenizer.decode_continuation(group.prompt_token_ids, seq.output_token_ids[:-1])
    assert out.outputs[0].text == expected and expected.endswith("\ufffd")
    assert out.outputs[0].finish_reason == "stop" and freed == [seq]
