"""huggingface_hub's InferenceClient against a real `quill serve` on a loopback port, as against a TGI server.

Given a URL, the client posts {"inputs", "parameters", "stream"?} to it as is (here: TGI's `/` route)
and reads either a list or an object back. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import pytest

pytest.importorskip("huggingface_hub")
from huggingface_hub import InferenceClient  # noqa: E402
from huggingface_hub.errors import ValidationError  # noqa: E402

PROMPT = "To be, or not"
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def hf(live_server) -> InferenceClient:
    return InferenceClient(base_url=live_server.url, api_key="unused", timeout=30)


@pytest.fixture(scope="module")
def plain_text(hf) -> str:
    return hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS)


def test_plain_text_generation(plain_text):
    assert isinstance(plain_text, str) and plain_text


def test_details(hf, plain_text):
    out = hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, details=True)
    assert out.generated_text == plain_text  # greedy by default, as TGI
    assert out.details.finish_reason == "length"
    assert out.details.generated_tokens == MAX_NEW_TOKENS == len(out.details.tokens)
    assert "".join(t.text for t in out.details.tokens if not t.special) == plain_text
    assert all(t.logprob <= 0 for t in out.details.tokens)


def test_stream(hf, plain_text):
    tokens = list(hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, stream=True))
    assert len(tokens) == MAX_NEW_TOKENS and all(isinstance(t, str) for t in tokens)
    assert "".join(tokens) == plain_text


def test_stream_with_details(hf, plain_text):
    outputs = list(hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, stream=True, details=True))
    assert len(outputs) == MAX_NEW_TOKENS
    assert all(o.generated_text is None and o.details is None for o in outputs[:-1])
    last = outputs[-1]
    assert last.generated_text == plain_text == "".join(o.token.text for o in outputs if not o.token.special)
    assert last.details.finish_reason == "length" and last.details.generated_tokens == MAX_NEW_TOKENS


def test_sampling_with_a_seed_reproduces(hf):
    a = hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, seed=11, details=True)
    b = hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, seed=11, details=True)
    assert a.generated_text == b.generated_text and a.details.seed == 11


def test_every_argument_quill_takes(hf):
    """Each argument of text_generation off its default, but those Quill lacks (next test)."""
    sampled = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=0.8, top_k=20, top_p=0.9,
                   repetition_penalty=1.2, frequency_penalty=0.5, stop=["\n\n"], truncate=3, details=True)
    out = hf.text_generation(PROMPT, seed=5, return_full_text=True, top_n_tokens=2, decoder_input_details=True,
                             **sampled)
    assert out.generated_text.startswith(PROMPT) and out.details.seed == 5 and len(out.details.prefill) == 3
    assert all(len(top) == 2 for top in out.details.top_tokens)
    best = hf.text_generation(PROMPT, best_of=2, **sampled)
    assert len(best.details.best_of_sequences) == 1
    streamed = list(hf.text_generation(PROMPT, stream=True, seed=5, top_n_tokens=2, **sampled))
    assert streamed[-1].details.seed == 5


@pytest.mark.parametrize("lacking", [dict(typical_p=0.5), dict(watermark=True), dict(adapter_id="lora"),
                                     dict(grammar={"type": "regex", "value": "a("})], ids=lambda d: next(iter(d)))
def test_validation_errors_reach_the_client_typed(hf, lacking):
    with pytest.raises(ValidationError, match=next(iter(lacking))):
        hf.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, **lacking)
