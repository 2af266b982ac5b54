"""Classic checkpoints served from their original files by the real server (engine in its own process), through
the openai client: completion, streaming, beam search and logprobs against the toolkit's own forward."""

from __future__ import annotations

import openai
import pytest
import torch

from quill.models.classic.conversion import convert
from tests.conftest import LiveServer
from tests.models.classic.awd_checkpoints import AwdLstm, awd_greedy, awd_logits, build_awd, save_awd
from tests.models.classic.wlm_checkpoints import (build_rnn_model, reference_beam, reference_greedy,
                                                  reference_logits, save_whole, write_corpus)

PROMPT = "the cat sat\non the"
PROMPTS = {"wlm-lstm": PROMPT, "wlm-gru": PROMPT, "awd-lstm": "The cat sat on NASA's"}


def greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    return (awd_greedy if isinstance(model, AwdLstm) else reference_greedy)(model, prompt_ids, max_tokens)


def logits(model, token_ids: list[int]) -> torch.Tensor:
    return (awd_logits if isinstance(model, AwdLstm) else reference_logits)(model, token_ids)


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """model name -> (the toolkit's model, the path served, its tokenizer)."""
    root = tmp_path_factory.mktemp("classic")
    lstm = build_rnn_model(root / "code", "LSTM")
    save_whole(lstm, write_corpus(root / "wlm-lstm") / "model.pt")  # served as its directory
    gru = build_rnn_model(root / "code", "GRU", tied=True, seed=1)
    save_whole(gru, write_corpus(root / "wlm-gru") / "model.pt")  # served as the model file
    awd = build_awd(seed=2)
    save_awd(awd, root / "awd")  # served as its directory: lstm_fwd.pth and itos_wt103.pkl
    served = {"wlm-lstm": (lstm, root / "wlm-lstm"), "wlm-gru": (gru, root / "wlm-gru" / "model.pt"),
              "awd-lstm": (awd, root / "awd")}
    return {name: (model, path, convert(path).tokenizer) for name, (model, path) in served.items()}


@pytest.fixture(scope="module")
def client(originals, tmp_path_factory):
    models = {name: str(path) for name, (_, path, _) in originals.items()}
    env = {"QUILL_CACHE_DIR": str(tmp_path_factory.mktemp("quill-cache"))}
    with LiveServer(models, "--engine-process", env=env) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


@pytest.mark.parametrize("name", list(PROMPTS))
def test_greedy_completion_and_stream_match_the_toolkit(originals, client, name):
    model, _, tokenizer = originals[name]
    prompt_ids = tokenizer.encode(PROMPTS[name])
    want_ids = greedy(model, prompt_ids, 10)
    want_text = tokenizer.decode_continuation(prompt_ids, want_ids)
    done = client.completions.create(model=name, prompt=PROMPTS[name], max_tokens=10, temperature=0, logprobs=1)
    choice = done.choices[0]
    assert choice.text == want_text and choice.finish_reason == "length"  # nothing ends a classic LM's text
    expected = torch.log_softmax(logits(model, prompt_ids + want_ids), -1)
    want_logprobs = [float(expected[len(prompt_ids) - 1 + j, t]) for j, t in enumerate(want_ids)]
    assert choice.logprobs.token_logprobs == pytest.approx(want_logprobs, abs=1e-4)
    stream = client.completions.create(model=name, prompt=PROMPTS[name], max_tokens=10, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == want_text


@pytest.mark.parametrize("name", ["wlm-lstm", "awd-lstm"])
def test_beam_search_matches_the_toolkit(originals, client, name):
    model, _, tokenizer = originals[name]
    prompt_ids = tokenizer.encode(PROMPTS[name])
    done = client.completions.create(model=name, prompt=PROMPTS[name], max_tokens=2, n=2, temperature=0,
                                     extra_body={"use_beam_search": True, "best_of": 2})
    beams = reference_beam(lambda ids: logits(model, ids), prompt_ids, 2, 2)
    want = [tokenizer.decode_continuation(prompt_ids, tokens) for tokens, _ in beams]
    assert [c.text for c in sorted(done.choices, key=lambda c: c.index)] == want


def test_models_are_named_as_served(client):
    assert [m.id for m in client.models.list()] == ["wlm-lstm", "wlm-gru", "awd-lstm"]


def test_served_in_the_api_process_too(originals, tmp_path):
    """Without --engine-process the API process converts and loads the original itself: same answer."""
    model, path, tokenizer = originals["awd-lstm"]
    prompt_ids = tokenizer.encode(PROMPTS["awd-lstm"])
    with LiveServer({"awd-lstm": str(path)}, env={"QUILL_CACHE_DIR": str(tmp_path / "cache")}) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        done = client.completions.create(model="awd-lstm", prompt=PROMPTS["awd-lstm"], max_tokens=6, temperature=0)
    assert done.choices[0].text == tokenizer.decode_continuation(prompt_ids, greedy(model, prompt_ids, 6))
