"""Encoder-decoder (translation) models served by a real `quill serve` beside a decoder-only model, through the
clients users already have: openai's completions (greedy, streamed, beam search n-best) and huggingface_hub's
InferenceClient against TGI's route; answers equal transformers' `generate()` of the same checkpoints; bad input
answered with a clear 400 while the server carries on."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch

from tests.conftest import LiveServer
from tests.seq2seq_models import write_checkpoint

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

TEXTS = ["the cat sat on the mat", "a quick brown fox", "no more than this", "over and over and over again"]


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("seq2seq")
    marian, _ = write_checkpoint(root / "marian", "marian", languages=["fra", "deu"])
    m2m, m2m_info = write_checkpoint(root / "m2m", "m2m_100", languages=("en", "fr", "de"))
    fsmt, _ = write_checkpoint(root / "fsmt", "fsmt")
    models = {"tiny-transformer": tiny_checkpoints["tiny-transformer"], "marian": str(root / "marian"),
              "m2m": str(root / "m2m"), "fsmt": str(root / "fsmt")}
    with LiveServer(models) as server:
        yield server, {"marian": marian, "m2m": m2m, "fsmt": fsmt}, m2m_info


def _reference(model, source_ids, forced=None, **kwargs):
    out = model.generate(torch.tensor([source_ids]), do_sample=False, forced_bos_token_id=forced, **kwargs)
    pad = model.config.pad_token_id
    return [[t for t in row[1:].tolist() if t != pad] for row in out]


def _source_ids(server, model: str, text: str, **langs) -> list[int]:
    """The source ids the server makes of `text`: its checkpoint's tokenizer, loaded here too."""
    from quill.models.loading.checkpoint import load_checkpoint

    return load_checkpoint(_path(server, model), weights=False).seq2seq.source_ids(text, **langs)


def _path(server, model):
    return next(a.split("=", 1)[1] for a in server.process.args if a.startswith(f"{model}="))


def test_models_say_what_they_are(served):
    server, _, _ = served
    data = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert data["m2m"]["encoder_decoder"] and {"en", "fr", "de"} <= set(data["m2m"]["languages"])
    assert data["marian"]["encoder_decoder"] and data["marian"]["languages"] == ["fra", "deu"]
    assert data["m2m"]["max_source_len"] == 64
    assert not data["tiny-transformer"]["encoder_decoder"]


def test_completions_equal_transformers(served):
    server, references, _ = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    ids = _source_ids(server, "m2m", TEXTS[0], source_lang="en", target_lang="fr")
    got = client.completions.create(model="m2m", prompt=TEXTS[0], max_tokens=8, temperature=0,
                                    extra_body={"source_lang": "en", "target_lang": "fr"})
    expected = _reference(references["m2m"], ids, load_forced(server, "fr"), max_new_tokens=8)[0]
    tokenizer = load_tokenizer(server, "m2m")
    assert got.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert got.usage.completion_tokens == len(expected) and got.usage.prompt_tokens == len(ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m2m", prompt=TEXTS[0], max_tokens=8, temperature=0, stream=True,
        extra_body={"source_lang": "en", "target_lang": "fr"}))
    assert streamed == got.choices[0].text


def test_beam_search_n_best(served):
    server, references, _ = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    text = ">>deu<< " + TEXTS[1]
    ids = _source_ids(server, "marian", text)
    got = client.completions.create(model="marian", prompt=text, max_tokens=8, n=3, best_of=4, temperature=0,
                                    extra_body={"use_beam_search": True, "length_penalty": 0.8,
                                                "no_repeat_ngram_size": 2})
    expected = _reference(references["marian"], ids, max_new_tokens=8, num_beams=4, num_return_sequences=3,
                          length_penalty=0.8, no_repeat_ngram_size=2)
    tokenizer = load_tokenizer(server, "marian")
    assert [c.text for c in got.choices] == [tokenizer.decode(e, skip_special_tokens=True) for e in expected]


def test_fsmt_moses_and_bpe_end_to_end(served):
    """FSMT: Moses tokenization and BPE in, BPE joined and Moses detokenization out, as transformers' tokenizer."""
    server, references, _ = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    text = "Hello, world: the cat's mat."
    ids = _source_ids(server, "fsmt", text)
    got = client.completions.create(model="fsmt", prompt=text, max_tokens=8, temperature=0, n=2, best_of=3,
                                    extra_body={"use_beam_search": True, "source_lang": "en", "target_lang": "de"})
    expected = _reference(references["fsmt"], ids, max_new_tokens=8, num_beams=3, num_return_sequences=2,
                          forced_eos_token_id=None)
    tokenizer = load_tokenizer(server, "fsmt")
    assert [c.text for c in got.choices] == [tokenizer.decode(e, skip_special_tokens=True) for e in expected]
    wrong = httpx.post(f"{server.url}/v1/completions", timeout=30,
                       json={"model": "fsmt", "prompt": text, "target_lang": "fr", "max_tokens": 3})
    assert wrong.status_code == 400 and "en into de" in wrong.json()["error"]["message"]


def test_tgi_inputs_are_the_source(served):
    server, references, _ = served
    text = ">>fra<< " + TEXTS[2]
    response = httpx.post(f"{server.url}/generate", json={"inputs": text, "model": "marian",
                                                          "parameters": {"max_new_tokens": 6}}, timeout=30)
    expected = _reference(references["marian"], _source_ids(server, "marian", text), max_new_tokens=6)[0]
    assert response.status_code == 200, response.text
    assert response.json()["generated_text"] == load_tokenizer(server, "marian").decode(expected,
                                                                                        skip_special_tokens=True)


def test_busy_server_with_both_kinds(served):
    """Translations and decoder-only completions at once: each answer is what it is alone."""
    server, _, _ = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")

    def translate(text):
        return client.completions.create(model="m2m", prompt=text, max_tokens=8, temperature=0,
                                         extra_body={"source_lang": "en", "target_lang": "de"}).choices[0].text

    def complete(text):
        return client.completions.create(model="tiny-transformer", prompt=text, max_tokens=8,
                                         temperature=0).choices[0].text

    alone = [translate(t) for t in TEXTS] + [complete(t) for t in TEXTS]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(translate, TEXTS)) + list(pool.map(complete, TEXTS))
    assert together == alone


@pytest.mark.parametrize("body, words", [
    ({"model": "m2m", "prompt": "hello", "extra": {"source_lang": "en", "target_lang": "xx"}}, ["xx", "fr"]),
    ({"model": "m2m", "prompt": "hello", "extra": {"target_lang": "fr"}}, ["source language"]),
    ({"model": "m2m", "prompt": list(range(5, 100)), "extra": {"target_lang": "fr"}}, ["64 source tokens"]),
    ({"model": "marian", "prompt": "hello", "extra": {"echo": True}}, ["echo"]),
    ({"model": "tiny-transformer", "prompt": "hello", "extra": {"target_lang": "fr"}}, ["encoder-decoder"]),
])
def test_bad_requests_are_refused_clearly(served, body, words):
    server, _, _ = served
    payload = {"model": body["model"], "prompt": body["prompt"], "max_tokens": 4, **body["extra"]}
    response = httpx.post(f"{server.url}/v1/completions", json=payload, timeout=30)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert all(w in message for w in words), message
    # the server carries on
    ok = httpx.post(f"{server.url}/v1/completions", json={"model": "marian", "prompt": "hello", "max_tokens": 3},
                    timeout=30)
    assert ok.status_code == 200


def test_chat_needs_a_template(served):
    server, _, _ = served
    response = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                          json={"model": "marian", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and "template" in response.json()["error"]["message"]


def load_tokenizer(server, model):
    from quill.models.loading.checkpoint import load_checkpoint

    return load_checkpoint(_path(server, model), weights=False).tokenizer


def load_forced(server, language):
    from quill.models.loading.checkpoint import load_checkpoint

    return load_checkpoint(_path(server, "m2m"), weights=False).seq2seq.target_prefix(language)[0]


def test_engine_in_a_process_of_its_own(served):
    """--engine-process: the API process tokenizes (weights not loaded), the engine process encodes and decodes; the
    forced target language travels with the request's settings."""
    server, _, _ = served
    body = {"model": "m2m", "prompt": TEXTS[3], "max_tokens": 8, "temperature": 0, "source_lang": "en",
            "target_lang": "fr"}
    expected = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
    with LiveServer({"m2m": _path(server, "m2m")}, "--engine-process") as separate:
        got = httpx.post(f"{separate.url}/v1/completions", json=body, timeout=30)
    assert got.status_code == 200 and got.json()["choices"][0]["text"] == expected
