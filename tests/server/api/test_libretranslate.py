"""LibreTranslate's API on the real server (tiny M2M100 and Marian checkpoints on a loopback port), driven by the
libretranslatepy client and httpx: translations equal transformers' generate() of the same checkpoint with the
same beams, lists answer in order, alternatives are the next beams, and bad requests answer 400 as LibreTranslate
does while the server carries on."""

from __future__ import annotations

import json
import urllib.error

import httpx
import pytest
import torch

from tests.conftest import LiveServer
from tests.seq2seq_fixtures import write_m2m100_tokenizer, write_marian_tokenizer
from tests.seq2seq_models import SHAPES, write_hf_model

libretranslatepy = pytest.importorskip("libretranslatepy")

TEXTS = ["The house is small.", "My friend reads books in the library", "we will see you tomorrow morning!"]
MAX_NEW = SHAPES["max_position_embeddings"] - 1  # the decoder's limit, less its start token: the server's bound
MARIAN_BEAMS = 3  # written into the Marian checkpoint's generation_config.json; M2M100's names none: 4


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """served name -> (transformers model, transformers tokenizer, directory)."""
    from transformers import M2M100Tokenizer, MarianTokenizer

    m2m = tmp_path_factory.mktemp("m2m100")
    info = write_m2m100_tokenizer(m2m)
    ids = {k: info[k] for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    m2m_model = write_hf_model(m2m, "m2m_100", vocab_size=info["vocab_size"], **ids)
    marian = tmp_path_factory.mktemp("marian")  # one pair, en -> fr, declared by its tokenizer_config.json
    info = write_marian_tokenizer(marian)
    ids = {k: info[k] for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    marian_model = write_hf_model(marian, "marian", vocab_size=info["vocab_size"], seed=1, **ids)
    generation = json.loads((marian / "generation_config.json").read_text())
    (marian / "generation_config.json").write_text(json.dumps({**generation, "num_beams": MARIAN_BEAMS}))
    return {"m2m": (m2m_model, M2M100Tokenizer.from_pretrained(str(m2m)), m2m),
            "marian": (marian_model, MarianTokenizer.from_pretrained(str(marian)), marian)}


def generate(references, name: str, text: str, source: str, target: str, beams: int, count: int = 1) -> list[str]:
    """transformers' best `count` translations, decoded as the server decodes them."""
    model, tokenizer, _ = references[name]
    kwargs = {}
    if name == "m2m":
        tokenizer.src_lang = source
        kwargs["forced_bos_token_id"] = tokenizer.get_lang_id(target)
    source_ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        out = model.generate(source_ids, num_beams=beams, num_return_sequences=count, max_new_tokens=MAX_NEW,
                             do_sample=False, **kwargs)
    # Language tokens are markers, not text (Quill skips them as special; transformers 5 decodes them as text)
    markers = set(getattr(tokenizer, "lang_code_to_id", {}).values())
    return [tokenizer.decode([t for t in seq if t not in markers], skip_special_tokens=True) for seq in out.tolist()]


@pytest.fixture(scope="module")
def server(references):
    server = LiveServer({name: str(directory) for name, (_, _, directory) in references.items()})
    try:
        # A generous wait: cross-attention on the CPU loads the C++ kernel, which a first server on a machine builds
        # (minutes on a busy one); stopping a server mid-build would leave the build's lock behind for every other.
        server.wait_ready(timeout=600)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lt(server):
    return libretranslatepy.LibreTranslateAPI(server.url + "/")


def post(server, **fields) -> httpx.Response:
    return httpx.post(f"{server.url}/translate", json=fields, timeout=60)


def test_the_client_translates_as_generate_does(references, lt):
    assert lt.translate(TEXTS[0], "en", "fr") == generate(references, "m2m", TEXTS[0], "en", "fr", beams=4)[0]
    assert lt.translate(TEXTS[1], "fr", "de") == generate(references, "m2m", TEXTS[1], "fr", "de", beams=4)[0]


def test_a_named_marian_pair_decodes_with_its_checkpoint_beams(references, server):
    response = post(server, q=TEXTS[0], source="en", target="fr", model="marian")
    assert response.status_code == 200, response.text
    want = generate(references, "marian", TEXTS[0], "en", "fr", beams=MARIAN_BEAMS)[0]
    assert response.json() == {"translatedText": want}
    refused = post(server, q=TEXTS[0], source="en", target="de", model="marian")  # not its declared pair
    assert refused.status_code == 400 and "'de'" in refused.json()["error"] and "fr" in refused.json()["error"]


def test_a_list_answers_a_list_in_order(references, server):
    response = post(server, q=TEXTS, source="en", target="de")
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == [generate(references, "m2m", t, "en", "de", beams=4)[0]
                                                 for t in TEXTS]


def test_alternatives_are_the_next_beams(references, server):
    want = generate(references, "m2m", TEXTS[2], "en", "fr", beams=4, count=3)
    form = httpx.post(f"{server.url}/translate", timeout=60,  # a form, as libretranslatepy sends: "2" is a string
                      data={"q": TEXTS[2], "source": "en", "target": "fr", "alternatives": "2", "format": "text"})
    assert form.status_code == 200, form.text
    assert form.json() == {"translatedText": want[0], "alternatives": want[1:]}
    listed = post(server, q=[TEXTS[2], TEXTS[2]], source="en", target="fr", alternatives=1).json()
    assert listed["translatedText"] == [want[0]] * 2 and listed["alternatives"] == [want[1:2]] * 2


def test_languages_lists_the_hosted_pairs(lt):
    languages = {entry["code"]: entry for entry in lt.languages()}
    assert languages["en"]["name"] == "English" and languages["fr"]["name"] == "French"
    assert {"fr", "de"} <= set(languages["en"]["targets"]) and "en" not in languages["en"]["targets"]
    assert len(languages) == 100  # M2M100's codes, every one a target of every other


def test_bad_requests_answer_400_and_the_server_carries_on(references, server, lt):
    with pytest.raises(urllib.error.HTTPError) as refused:  # the client's own view of a refusal
        lt.translate(TEXTS[0], "en", "xx")
    assert refused.value.code == 400
    error = json.loads(refused.value.read())["error"]
    assert "'xx'" in error and "en" in error and "fr" in error
    cases = {
        "empty list": (dict(q=[], source="en", target="fr"), "empty"),
        "unknown source": (dict(q="a", source="qq", target="fr"), "'qq'"),
        "missing target": (dict(q="a", source="en"), "target"),
        "html": (dict(q="<b>a</b>", source="en", target="fr", format="html"), "html"),
        "too long": (dict(q=" ".join(["house"] * 100), source="en", target="fr"), "64 tokens"),
        "auto with a model that needs the source": (dict(q="a", source="auto", target="fr", model="m2m"), "auto"),
        "auto into a language only a model that needs the source has": (dict(q="a", source="auto", target="de"),
                                                                         "auto"),
        "too many alternatives": (dict(q="a", source="en", target="fr", alternatives=50), "alternatives"),
    }
    for name, (fields, needle) in cases.items():
        response = post(server, **fields)
        assert response.status_code == 400, (name, response.text)
        assert needle in response.json()["error"], (name, response.json())
    assert post(server, q="a", source="en", target="fr", model="nope").status_code == 404
    detect = httpx.post(f"{server.url}/detect", data={"q": "hello"}, timeout=10)
    assert detect.status_code == 501 and "source language" in detect.json()["error"]
    # "auto" goes to a model that needs no source language: the Marian pair
    auto = post(server, q=TEXTS[0], source="auto", target="fr")
    assert auto.status_code == 200, auto.text
    assert auto.json()["translatedText"] == generate(references, "marian", TEXTS[0], "en", "fr", MARIAN_BEAMS)[0]
    assert lt.translate(TEXTS[0], "en", "fr") == generate(references, "m2m", TEXTS[0], "en", "fr", beams=4)[0]


def test_client_codes_reach_each_family_codes():
    """LibreTranslate's clients send ISO 639-1 codes; NLLB, mBART and Marian's multilingual targets name theirs
    otherwise. A code that names two of a model's languages (zh: two scripts) names none."""
    from quill.server.api.libretranslate.schemas import language_name, match_code

    assert match_code("fr", ["eng_Latn", "fra_Latn"]) == "fra_Latn"
    assert match_code("fr", ["en_XX", "fr_XX"]) == "fr_XX" and match_code("fra", ["fr", "de"]) == "fr"
    assert match_code("fr", ["fra", "deu"]) == "fra" and match_code("it", ["fra", "deu"]) is None
    assert match_code("zh", ["zho_Hans", "zho_Hant"]) is None and match_code("zho_Hant", ["zho_Hans", "zho_Hant"])
    assert [language_name(c) for c in ("fra_Latn", "fr_XX", "deu", "xyz")] == ["French (Latn)", "French", "German",
                                                                              "xyz"]
