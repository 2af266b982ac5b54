"""State-space, xLSTM and short-convolution checkpoints served by the real server, through the openai client:
completions against transformers, streaming, n > 1, beam search, stop strings, aborts, chat, and a second chat
turn that resumes from the first turn's state."""

from __future__ import annotations

import asyncio
import importlib
import json
import time

import httpx
import openai
import pytest

from benchmarks.soak import metric_values, wait_idle
from tests.conftest import LiveServer
from tests.hf_state_models import greedy_by_forwards
from tests.hub_checkpoints import CHATML_TEMPLATE
FAMILIES = {  # served name -> (module of tests/hf_state_models, config changes)
    "mamba": ("mamba", {}),
    "falcon-mamba": ("mamba", {"model_type": "falcon_mamba"}),
    "mamba2": ("mamba2", {}),
    "xlstm": ("xlstm", {}),
    "lfm2": ("lfm2", {"max_position_embeddings": 16384}),
}
PROMPT = "To be, or not to be"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """served name -> (the transformers model, its directory)."""
    out = {}
    for name, (module, changes) in FAMILIES.items():
        directory = tmp_path_factory.mktemp(name)
        reference = importlib.import_module(f"tests.hf_state_models.{module}").save_tiny(directory, **changes)
        (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML_TEMPLATE}))
        out[name] = (reference, directory)
    return out


@pytest.fixture(scope="module")
def server(served):
    with LiveServer({name: str(path) for name, (_, path) in served.items()}, "--max-num-seqs", "8",
                    "--max-model-len", "16384") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def tokenizer_of(served, name):
    from quill.models.loading.checkpoint import load_checkpoint

    return load_checkpoint(served[name][1], device="cpu", dtype="float32", weights=False).tokenizer


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_completion_and_stream_equal_transformers(served, client, name):
    reference, _ = served[name]
    tokenizer = tokenizer_of(served, name)
    prompt_ids = tokenizer.encode(PROMPT)
    want = greedy_by_forwards(reference, prompt_ids, 12)
    done = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].text == tokenizer.decode(want)
    stream = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(chunk.choices[0].text for chunk in stream) == done.choices[0].text


@pytest.mark.parametrize("name", list(FAMILIES))
def test_samples_beams_and_stop_strings(client, name):
    sampled = client.completions.create(model=name, prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                                        extra_body={"ignore_eos": True})
    assert sorted(c.index for c in sampled.choices) == [0, 1, 2]
    again = client.completions.create(model=name, prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                                      extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in sampled.choices]  # seeded: reproducible
    beams = client.completions.create(model=name, prompt=PROMPT, max_tokens=4, n=2, temperature=0,
                                      extra_body={"use_beam_search": True, "best_of": 3, "ignore_eos": True})
    assert len(beams.choices) == 2 and beams.choices[0].text != beams.choices[1].text
    text = client.completions.create(model=name, prompt=PROMPT, max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = client.completions.create(model=name, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[: text.index(stop)]


def test_an_aborted_stream_frees_its_state(server, client):
    stream = client.completions.create(model="mamba2", prompt=PROMPT, max_tokens=200, stream=True,
                                       extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()

    async def idle():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            return await wait_idle(c)

    assert all(v == 0 for v in asyncio.run(idle()).values())
    assert httpx.get(f"{server.url}/health").status_code == 200


def first_token_seconds(client, name: str, messages: list[dict]) -> tuple[float, str]:
    start = time.perf_counter()
    first, text = None, ""
    for chunk in client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first or time.perf_counter() - start
            text += delta
    return first, text


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_second_chat_turn_resumes_from_the_first(served, server, client, name):
    """Three conversations, each of a long first turn and a short second: the second turn resumes from the state
    the first left (the prefix-hit counter rises by the first turn's prompt) and its first token comes sooner."""

    def hits() -> float:
        return metric_values(httpx.get(f"{server.url}/metrics").text, "quill_prefix_cache_hits_total").get(name, 0)

    speedups = []
    for story_id in range(3):  # about 8,000 tokens each, none a prefix of another
        story = f"Story {story_id}. " + " ".join(f"line {i} of the play, spoken slowly;" for i in range(300))
        turn = [{"role": "user", "content": story}]
        before = hits()
        first_ttft, answer = first_token_seconds(client, name, turn)
        first_prompt = httpx.post(f"{server.url}/tokenize", json={"model": name, "messages": turn}).json()["count"]
        assert hits() - before < 50 and first_prompt > 5000  # nothing but the template's opening was cached
        turn += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        second_ttft, _ = first_token_seconds(client, name, turn)
        # At least the whole first prompt came from its saved state (a hybrid's: its whole K,V blocks of 4 tokens).
        assert hits() - before >= (first_prompt // 4 * 4 if name == "lfm2" else first_prompt)
        speedups.append(first_ttft / second_ttft)
    print(f"{name}: second turns came {sorted(speedups)[1]:.1f}x sooner (median of 3)")
    # The median: a prefill of thousands of tokens against one of a few. Without the reuse the two would cost the
    # same (about 1x); Mamba-2's chunked prefill of a tiny model is cheap enough that its median is near 3x alone and
    # fell to 1.9x with another test process on the same two cores (make test runs two), hence 1.5x.
    assert sorted(speedups)[1] > 1.5, speedups
