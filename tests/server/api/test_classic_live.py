"""Classic checkpoints served from their original files by the real server (engine in its own process), through
the openai client: completion, streaming, beam search and logprobs against the toolkit's own forward."""

from __future__ import annotations

import openai
import pytest
import torch

from models.classic.formats import convert
from tests.conftest import LiveServer
from tests.models.classic.wlm_checkpoints import (build_rnn_model, reference_beam, reference_greedy,
                                                  reference_logits, save_whole, write_corpus)

PROMPT = "the cat sat\non the"


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """model name -> (the toolkit's model, the path served, its tokenizer)."""
    root = tmp_path_factory.mktemp("classic")
    lstm = build_rnn_model(root / "code", "LSTM")
    save_whole(lstm, write_corpus(root / "wlm-lstm") / "model.pt")  # served as its directory
    gru = build_rnn_model(root / "code", "GRU", tied=True, seed=1)
    save_whole(gru, write_corpus(root / "wlm-gru") / "model.pt")  # served as the model file
    served = {"wlm-lstm": (lstm, root / "wlm-lstm"), "wlm-gru": (gru, root / "wlm-gru" / "model.pt")}
    return {name: (model, path, convert(path).tokenizer) for name, (model, path) in served.items()}


@pytest.fixture(scope="module")
def client(originals, tmp_path_factory):
    models = {name: str(path) for name, (_, path, _) in originals.items()}
    env = {"QUILL_CACHE_DIR": str(tmp_path_factory.mktemp("quill-cache"))}
    with LiveServer(models, "--engine-process", env=env) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


@pytest.mark.parametrize("name", ["wlm-lstm", "wlm-gru"])
def test_greedy_completion_and_stream_match_the_toolkit(originals, client, name):
    model, _, tokenizer = originals[name]
    prompt_ids = tokenizer.encode(PROMPT)
    want_ids = reference_greedy(model, prompt_ids, 10)
    want_text = tokenizer.decode_continuation(prompt_ids, want_ids)
    done = client.completions.create(model=name, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=1)
    choice = done.choices[0]
    assert choice.text == want_text and choice.finish_reason == "length"  # <eos> is a newline, not an end
    expected = torch.log_softmax(reference_logits(model, prompt_ids + want_ids), -1)
    want_logprobs = [float(expected[len(prompt_ids) - 1 + j, t]) for j, t in enumerate(want_ids)]
    assert choice.logprobs.token_logprobs == pytest.approx(want_logprobs, abs=1e-4)
    stream = client.completions.create(model=name, prompt=PROMPT, max_tokens=10, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == want_text


def test_beam_search_matches_the_toolkit(originals, client):
    model, _, tokenizer = originals["wlm-lstm"]
    prompt_ids = tokenizer.encode(PROMPT)
    done = client.completions.create(model="wlm-lstm", prompt=PROMPT, max_tokens=3, n=3, temperature=0,
                                     extra_body={"use_beam_search": True, "best_of": 3})
    want = [tokenizer.decode_continuation(prompt_ids, tokens) for tokens, _ in reference_beam(model, prompt_ids, 3, 3)]
    assert [c.text for c in sorted(done.choices, key=lambda c: c.index)] == want


def test_models_are_named_as_served(client):
    assert [m.id for m in client.models.list()] == ["wlm-lstm", "wlm-gru"]
