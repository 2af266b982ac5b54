"""Translation models saved by fairseq, served by a real `quill serve` straight from the toolkit's files (converted on
load): the openai client's completions (greedy, a target prefix) and the LibreTranslate client's translations equal
a reference decoding of the same weights, the text Moses-detokenized with its BPE marks joined."""

from __future__ import annotations

import httpx
import pytest
import torch

from quill.models.loading.checkpoint import load_checkpoint
from tests.conftest import LiveServer
from tests.models.classic.fairseq_translation_files import SENTENCES, write_fairseq_checkpoint
from tests.models.classic.test_fairseq_translation import ARGS, SOURCE_ROWS, TARGET_ROWS, _fairseq_state
from tests.seq2seq_models import write_hf_model
from tests.toolkit_reference import never_pad, reference_beam, reference_greedy

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
libretranslatepy = pytest.importorskip("libretranslatepy")

MAX_NEW = 12


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("toolkit-live")
    reference = write_hf_model(root / "hf", "fsmt", vocab_size=TARGET_ROWS, src_vocab_size=SOURCE_ROWS)
    write_fairseq_checkpoint(root / "wmt", _fairseq_state(reference), "transformer_wmt_en_de", SOURCE_ROWS,
                             TARGET_ROWS, **ARGS)
    server = LiveServer({"fairseq-wmt": str(root / "wmt")}, env={"QUILL_CACHE_DIR": str(root / "cache")})
    try:
        server.wait_ready(timeout=600)  # a first server on a machine builds the CPU attention kernel
        # what the server loaded (its cached conversion), for the source ids and the decoding of references
        loaded = load_checkpoint(next((root / "cache" / "classic").iterdir()), weights=False)
        yield server, reference, loaded
    finally:
        server.stop()


def _next_logprobs(reference, source):
    def step(prefix):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix])).logits
        return never_pad(logits[0, -1].log_softmax(-1))
    return step


def test_openai_completion_and_target_prefix(served):
    server, reference, loaded = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    source = loaded.seq2seq.source_ids(SENTENCES[0])
    step = _next_logprobs(reference, source)
    expected = reference_greedy(step, 2, MAX_NEW, 2)
    got = client.completions.create(model="fairseq-wmt", prompt=SENTENCES[0], max_tokens=MAX_NEW, temperature=0,
                                    extra_body={"source_lang": "en", "target_lang": "de"})
    assert got.choices[0].text == loaded.tokenizer.decode(expected)
    assert got.usage.prompt_tokens == len(source) and got.usage.completion_tokens == len(expected)
    prefix = loaded.tokenizer.encode("His house", add_special_tokens=False)
    out: list[int] = []  # greedy after the forced tokens
    while len(prefix) + len(out) < MAX_NEW and (not out or out[-1] != 2):
        out.append(int(step([2] + prefix + out).argmax()))
    prefixed = client.completions.create(model="fairseq-wmt", prompt=SENTENCES[0], max_tokens=MAX_NEW, temperature=0,
                                         extra_body={"target_prefix": "His house"})
    assert prefixed.choices[0].text == loaded.tokenizer.decode(prefix + out)
    assert prefixed.choices[0].text.startswith("His house")


def test_beam_search_with_a_coverage_penalty(served):
    """The openai client's beam request with OpenNMT's coverage penalty answers the best of the reference beam search
    whose coverage is the reference's own cross-attention (the last layer's, averaged over heads); its near-tied
    runners-up are left out (tests/server/engine/test_coverage_penalty.py compares whole n-best lists). A type the
    server does not know gets a 400 naming the field."""
    server, reference, loaded = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    source = loaded.seq2seq.source_ids(SENTENCES[1])

    def penalty(prefix):  # Wu et al. 2016, beta 0.4
        with torch.no_grad():
            out = reference(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix]),
                            output_attentions=True)
        return -0.4 * float(out.cross_attentions[-1][0].mean(0).sum(0).clamp(max=1.0).log().sum())

    best = reference_beam(_next_logprobs(reference, source), 2, MAX_NEW, 2, width=4, n=1, penalty=penalty)[0][0]
    got = client.completions.create(model="fairseq-wmt", prompt=SENTENCES[1], max_tokens=MAX_NEW, temperature=0,
                                    best_of=4, extra_body={"use_beam_search": True, "coverage_penalty": 0.4})
    assert got.choices[0].text == loaded.tokenizer.decode(best)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="fairseq-wmt", prompt=SENTENCES[1], max_tokens=MAX_NEW, best_of=4,
                                  extra_body={"use_beam_search": True, "coverage_penalty_type": "gnmt"})
    assert refused.value.body["param"] == "coverage_penalty_type"


def test_libretranslate_client(served):
    server, reference, loaded = served
    client = libretranslatepy.LibreTranslateAPI(server.url + "/")
    assert {lang["code"] for lang in client.languages()} == {"en", "de"}
    for text in SENTENCES[:2]:
        best = reference_beam(_next_logprobs(reference, loaded.seq2seq.source_ids(text)), 2,
                              loaded.model.config.max_seq_len - 1, 2, width=4, n=1)[0][0]
        assert client.translate(text, "en", "de") == loaded.tokenizer.decode(best)


def test_other_languages_are_refused(served):
    server, _, _ = served
    response = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
        "model": "fairseq-wmt", "prompt": "hello", "target_lang": "fr", "max_tokens": 3})
    assert response.status_code == 400 and "en into de" in response.json()["error"]["message"]
