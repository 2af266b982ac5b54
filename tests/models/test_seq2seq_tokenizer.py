"""Encoder-decoder tokenizers read without transformers (quill/models/text/seq2seq_tokenizer.py) against
transformers' own tokenizers on the same directories (tests/seq2seq_fixtures.py): encoder ids, target decoding
(whole and incremental), language codes, and the errors for a language or a file a checkpoint lacks."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quill.models.loading.errors import CheckpointError
from quill.models.text.seq2seq_tokenizer import Seq2SeqTokenizer, load_seq2seq_tokenizer
from quill.models.text.tokenizer import IncrementalDecoder
from tests.seq2seq_fixtures import (FRENCH, GERMAN, corpus, write_bart_tokenizer, write_m2m100_tokenizer,
                                    write_marian_tokenizer, write_mbart50_tokenizer, write_mbart_tokenizer,
                                    write_nllb_tokenizer, write_t5_tokenizer)

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")  # MarianTokenizer's

TEXTS = [
    "", " ", "la maison est petite.", "The small house is green today.", "Straße über größer Brücke",
    "l'élève à la bibliothèque, déjà!", "Where is 2024? 3.14 and 1,000,000", "  leading and trailing  ",
    "multiple   spaces\tand\ttabs", "line one\nline two", "UPPER lower MiXeD", "漢字 and 🙂 emoji",
    "Ελληνικά кириллица عربى", "ﬁ ligature ① circled Ⅻ numeral", "“quotes” ‘single’ «guillemets»",
    "a-b_c/d\\e|f", "!!!???...", "naïve café résumé", "x", "é", "</s> in the middle", "<unk><pad>",
    ">>fra<< already coded", "  >>deu<< indented code", "ends with space ", "trailing punctuation …",
    "numbers 0 1 2 3 4 5 6 7 8 9", "wir sehen dich morgen früh", "Ich weiß nicht, warum.", "&amp; <b>html</b>",
]
# Random strings of letters, spaces of all kinds and the families' special and language tokens.
_PARTS = list("abcdeéèàüßXYZ 0123456789.,!?'\"-\t\n") + [
    "la ", "maison ", "über", "  ", "\u00a0", "\u3000", "ﬁ", "▁", "漢", "🙂", "</s>", "<s>", "<unk>", "<pad>", "<mask>",
    ">>fra<<", ">>", "<<", "__fr__", "eng_Latn", "fr_XX", "<extra_id_0>"]
_rng = random.Random(5)
RANDOM_TEXTS = ["".join(_rng.choice(_PARTS) for _ in range(_rng.randint(0, 20))) for _ in range(150)]
TARGET_TEXTS = corpus(FRENCH + GERMAN, lines=25, seed=11) + [
    "la maison est petite.", "Straße über café 2024!", "漢字 and 🙂", "a  b   c", " x ", "l'école", "ﬁ ① Ⅻ", "",
] + RANDOM_TEXTS[:50]


@dataclass
class Family:
    name: str
    directory: Path
    info: dict
    config: dict
    pairs: list  # (source_lang, target_lang) as Quill takes them
    quill: Seq2SeqTokenizer
    references: dict = field(default_factory=dict)

    def reference(self, source_lang=None, target_lang=None):
        """transformers' tokenizer of the directory, with the family's language settings."""
        from transformers import AutoTokenizer

        key = (source_lang, target_lang)
        if key not in self.references:
            kwargs = {} if self.config["model_type"] == "marian" or source_lang is None else dict(
                src_lang=source_lang, tgt_lang=target_lang)
            self.references[key] = AutoTokenizer.from_pretrained(str(self.directory), **kwargs)
        return self.references[key]

    def reference_ids(self, text, source_lang, target_lang):
        if self.config["model_type"] == "marian" and target_lang is not None:
            text = f">>{target_lang}<< {text}"  # how transformers' users pick a Marian target
        return self.reference(source_lang, target_lang)(text)["input_ids"]

    def diverging_ids(self) -> set[int]:
        """Ids whose decoding transformers 5 gets wrong, so Quill differs on purpose (see the tests below)."""
        if self.name == "m2m100":  # language tokens and madeup words (after vocab.json): decoded as text
            vocab = json.loads((self.directory / "vocab.json").read_text(encoding="utf-8"))
            return set(range(len(vocab), self.info["vocab_size"]))
        if self.name == "marian-separate":  # transformers skips the SOURCE vocabulary's special ids in targets
            ref = self.reference()
            return set(ref.all_special_ids) | {self.quill.target.token_to_id(t) for t in ("</s>", "<unk>", "<pad>")}
        return set()


FAMILIES = {
    "marian": (lambda d: write_marian_tokenizer(d, ["fra", "deu"]), "marian", [(None, "fra"), (None, "deu"),
                                                                               (None, None)]),
    "marian-separate": (lambda d: write_marian_tokenizer(d, separate_vocabs=True), "marian", [(None, None)]),
    "m2m100": (write_m2m100_tokenizer, "m2m_100", [("en", "fr"), ("fr", "de")]),
    "nllb": (write_nllb_tokenizer, "m2m_100", [("eng_Latn", "fra_Latn"), ("deu_Latn", "eng_Latn")]),
    "nllb-legacy": (lambda d: write_nllb_tokenizer(d, legacy_behaviour=True), "m2m_100", [("fra_Latn", "eng_Latn")]),
    "mbart50": (write_mbart50_tokenizer, "mbart", [("en_XX", "fr_XX"), ("de_DE", "en_XX")]),
    "mbart": (write_mbart_tokenizer, "mbart", [("en_XX", "fr_XX"), ("de_DE", "en_XX")]),
    "t5": (write_t5_tokenizer, "t5", [(None, None)]),
    "bart": (write_bart_tokenizer, "bart", [(None, None)]),
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Each family's directory, written once for the module, when a test first asks for it."""
    built = {}

    def get(name: str) -> Family:
        if name not in built:
            writer, model_type, pairs = FAMILIES[name]
            directory = tmp_path_factory.mktemp(name)
            info = writer(directory)
            config = {"model_type": model_type}
            built[name] = Family(name, directory, info, config, pairs, load_seq2seq_tokenizer(directory, config))
        return built[name]

    return get


@pytest.fixture(params=list(FAMILIES))
def family(request, families) -> Family:
    return families(request.param)


def test_source_ids_are_transformers_ids(family):
    for source_lang, target_lang in family.pairs:
        for text in TEXTS + RANDOM_TEXTS:
            expected = family.reference_ids(text, source_lang, target_lang)
            assert family.quill.source_ids(text, source_lang, target_lang) == expected, (text, source_lang)


def _decode_pairs(family, rng):
    """Random id sequences from the vocabulary, then the ids of target texts as transformers encodes them."""
    diverging = family.diverging_ids()
    usable = [i for i in range(family.info["vocab_size"]) if i not in diverging]
    for _ in range(300):
        yield [rng.choice(usable) for _ in range(rng.randint(0, 16))]
    source_lang, target_lang = family.pairs[0]
    ref = family.reference(source_lang, target_lang)
    for text in TARGET_TEXTS:
        yield [i for i in ref(text_target=text)["input_ids"] if i not in diverging]


def test_target_decoding_is_transformers_decoding(family):
    ref = family.reference(*family.pairs[0])
    for ids in _decode_pairs(family, random.Random(0)):
        assert family.quill.target.decode(ids) == ref.decode(ids, skip_special_tokens=True), ids


def test_incremental_decoding_adds_up_to_the_whole(family):
    """The engine decodes after the decoder's prompt (decoder_start_token_id, then the forced language token)."""
    source_lang, target_lang = family.pairs[0]
    prompt = [family.info["decoder_start_token_id"]] + family.quill.target_prefix(target_lang)
    ref = family.reference(source_lang, target_lang)
    for ids in _decode_pairs(family, random.Random(1)):
        decoder = IncrementalDecoder(family.quill.target, prompt)
        text = "".join(decoder.push(i) for i in ids) + decoder.flush()
        assert text == family.quill.target.decode_continuation(prompt, ids) == ref.decode(ids, skip_special_tokens=True)


def test_eos_and_the_fixture_config(family):
    info = family.info
    assert set(info) >= {"vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id"}
    assert family.quill.target.eos_token_id == info["eos_token_id"]
    assert family.quill.target.vocab_size == info["vocab_size"] <= 500  # tiny models stay tiny
    ids = family.quill.source_ids("x", *family.pairs[0])
    assert info["eos_token_id"] == (ids[-2] if family.quill.style == "suffix" else ids[-1])


def test_languages_and_target_prefix(family):
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES as M2M100_CODES
    from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES as MBART_CODES
    from transformers.models.mbart50.tokenization_mbart50 import FAIRSEQ_LANGUAGE_CODES as MBART50_CODES

    quill = family.quill
    nllb = ["eng_Latn", "fra_Latn", "deu_Latn"]
    expected = {"marian": ["fra", "deu"], "m2m100": M2M100_CODES["m2m100"], "nllb": nllb, "nllb-legacy": nllb,
                "mbart50": MBART50_CODES, "mbart": MBART_CODES}.get(family.name, [])
    assert quill.languages == expected
    for code, token_id in family.info.get("lang_token_ids", {}).items():
        assert quill.target_prefix(code) == [token_id]  # transformers' forced_bos_token_id
    if family.name.startswith("marian") or not quill.languages:
        assert quill.target_prefix(None) == []


def test_a_marian_target_language_starts_the_source(families):
    quill = families("marian").quill
    fra = quill.target.token_to_id(">>fra<<")
    assert quill.target_prefix("fra") == []
    assert quill.source_ids("la maison", target_lang="fra")[0] == fra
    assert quill.source_ids("la maison", "en", "fra") == quill.source_ids("la maison", None, "fra")  # ignored
    assert fra not in quill.source_ids("la maison")


def test_an_unknown_language_is_refused_naming_the_known_ones(family):
    quill = family.quill
    source_lang, target_lang = family.pairs[0]
    if not quill.languages:
        with pytest.raises(ValueError, match="takes no language codes"):
            quill.target_prefix("fr")
        with pytest.raises(ValueError, match="takes no language codes"):
            quill.source_ids("x", target_lang="fr")
        return
    with pytest.raises(ValueError, match=f"unknown target language 'xx_YY'.*{quill.languages[-1]}"):
        quill.target_prefix("xx_YY")
    with pytest.raises(ValueError, match="unknown target language 'xx_YY'"):
        quill.source_ids("x", source_lang, "xx_YY")
    if family.name != "marian":  # the others mark the source language, and need it
        with pytest.raises(ValueError, match=f"unknown source language 'xx_YY'.*{quill.languages[0]}"):
            quill.source_ids("x", "xx_YY", target_lang)
        with pytest.raises(ValueError, match="needs a source language"):
            quill.source_ids("x", None, target_lang)
        with pytest.raises(ValueError, match="needs a target language"):
            quill.target_prefix(None)


def test_m2m100_language_tokens_and_madeup_words_decode_to_nothing(families):
    """transformers 5's M2M100Tokenizer no longer marks its language tokens special, so decode(...,
    skip_special_tokens=True) writes "__fr__" into the text, and its 8 madeup words as "<unk>"; transformers 4
    skipped the language tokens. Quill skips both."""
    family = families("m2m100")
    quill, ref = family.quill, family.reference("en", "fr")
    ids = ref(text_target="la maison")["input_ids"]  # [__fr__, ..., </s>]
    madeup = family.info["vocab_size"] - 1
    assert ids[0] == family.info["lang_token_ids"]["fr"]
    assert ref.decode(ids, skip_special_tokens=True) == "__fr__ la maison"  # what transformers 5 does
    assert ref.decode([madeup], skip_special_tokens=True) == "<unk>"
    assert quill.target.decode(ids + [madeup]) == ref.decode(ids[1:], skip_special_tokens=True) == "la maison"


def test_marian_separate_vocabularies_skip_the_targets_own_specials(families):
    """With separate_vocabs, transformers skips the SOURCE vocabulary's special ids when it decodes target ids (a
    target piece at the source's <pad> id vanishes, the target's own <pad> is printed); Quill skips the target's."""
    family = families("marian-separate")
    ref, target = family.reference(), family.quill.target
    source_pad = ref.pad_token_id
    target_pad = target.token_to_id("<pad>")
    assert source_pad != target_pad
    assert ref.decode([target_pad], skip_special_tokens=True) == "<pad>"
    assert target.decode([target_pad]) == ""
    assert target.decode([source_pad]) == target.id_to_token(source_pad).replace("▁", " ").strip()


def _copy_without(directory: Path, tmp_path: Path, *names: str) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    for name in names:
        (copy / name).unlink()
    return copy


@pytest.mark.parametrize("name, missing, also_missing", [
    ("marian", "source.spm", ()), ("marian", "target.spm", ()), ("marian", "vocab.json", ()),
    ("marian-separate", "target_vocab.json", ()),
    ("m2m100", "sentencepiece.bpe.model", ()), ("m2m100", "vocab.json", ()),
    # the tokenizer.json families need their SentencePiece model when they ship no tokenizer.json
    ("t5", "spiece.model", ("tokenizer.json",)), ("mbart50", "sentencepiece.bpe.model", ("tokenizer.json",)),
    ("nllb", "sentencepiece.bpe.model", ("tokenizer.json",)),
    ("bart", "tokenizer.json", ("merges.txt",)),
])
def test_a_directory_lacking_a_file_its_tokenizer_needs_names_it(families, tmp_path, name, missing, also_missing):
    family = families(name)
    with pytest.raises(CheckpointError, match=missing.replace(".", r"\.")) as raised:
        load_seq2seq_tokenizer(_copy_without(family.directory, tmp_path, missing, *also_missing), family.config)
    assert raised.value.path.name == missing


@pytest.mark.parametrize("name", ["t5", "mbart50", "mbart", "nllb", "bart"])
def test_without_tokenizer_json_the_sentencepiece_model_gives_the_same_tokenizer(families, tmp_path, name):
    """T5 (mT5), mBART and mBART-50 checkpoints often ship only their SentencePiece model: Quill builds what
    transformers builds from it, which encodes and decodes as the tokenizer.json that transformers saves. (NLLB's
    language codes then come from tokenizer_config.json; BART's tokenizer from vocab.json and merges.txt.)"""
    family = families(name)
    quill = load_seq2seq_tokenizer(_copy_without(family.directory, tmp_path, "tokenizer.json"), family.config)
    assert quill.languages == family.quill.languages
    for source_lang, target_lang in family.pairs:
        for text in TEXTS:
            expected = family.reference_ids(text, source_lang, target_lang)
            assert quill.source_ids(text, source_lang, target_lang) == expected, text
    ref = family.reference(*family.pairs[0])
    rng = random.Random(2)
    for _ in range(100):
        ids = [rng.randrange(family.info["vocab_size"]) for _ in range(rng.randint(0, 12))]
        assert quill.target.decode(ids) == ref.decode(ids, skip_special_tokens=True), ids


def test_an_unknown_model_type_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="model_type 'llama'"):
        load_seq2seq_tokenizer(tmp_path, {"model_type": "llama"})


def test_quill_reads_them_without_transformers():
    code = ("import sys, quill.models.text.seq2seq_tokenizer; "
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
