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
from tests.seq2seq_fixtures import (FRENCH, GERMAN, corpus, write_bart_tokenizer, write_fsmt_tokenizer,
                                    write_m2m100_tokenizer, write_marian_tokenizer, write_mbart50_tokenizer,
                                    write_mbart_tokenizer, write_nllb_tokenizer, write_t5_tokenizer)

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("sacremoses")
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
            kwargs = {} if self.config["model_type"] in ("marian", "fsmt") or source_lang is None else dict(
                src_lang=source_lang, tgt_lang=target_lang)
            self.references[key] = AutoTokenizer.from_pretrained(str(self.directory), **kwargs)
        return self.references[key]

    def reference_ids(self, text, source_lang, target_lang):
        if self.config["model_type"] == "marian" and target_lang is not None:
            text = f">>{target_lang}<< {text}"  # how transformers' users pick a Marian target
        return self.reference(source_lang, target_lang)(text)["input_ids"]

    def target_ids(self, text):
        """The ids of a target-language text as transformers encodes it. FSMTTokenizer's text_target goes through
        the source side (its rules and vocabulary): a tokenizer of the reversed pair does the target's."""
        if self.config["model_type"] != "fsmt":
            return self.reference(*self.pairs[0])(text_target=text)["input_ids"]
        if "reversed" not in self.references:
            from transformers import FSMTTokenizer

            d = self.directory
            self.references["reversed"] = FSMTTokenizer(
                langs=list(reversed(self.pairs[0])), src_vocab_file=str(d / "vocab-tgt.json"),
                tgt_vocab_file=str(d / "vocab-src.json"), merges_file=str(d / "merges.txt"))
        return self.references["reversed"](text)["input_ids"]

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
    "fsmt": (lambda d: _with_vocab_size(write_fsmt_tokenizer(d)), "fsmt", [("en", "de"), (None, None)]),
}


def _with_vocab_size(info: dict) -> dict:
    return {**info, "vocab_size": info["tgt_vocab_size"]}  # FSMT's model config has one per side


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
    for text in TARGET_TEXTS:
        yield [i for i in family.target_ids(text) if i not in diverging]


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
        if family.name == "fsmt" and not _moses_window_safe(family.quill.target, ids):
            continue  # see test_fsmt_incremental_decoding_where_moses_needs_more_than_the_window
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
    if family.name == "fsmt":  # one pair, unmarked: its own codes are taken, no others
        with pytest.raises(ValueError, match="target language 'fr': this checkpoint translates en into de only"):
            quill.target_prefix("fr")
        with pytest.raises(ValueError, match="source language 'de': .* en into de only"):
            quill.source_ids("x", "de", "en")
        assert quill.target_prefix("de") == quill.target_prefix(None) == []
        return
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
    ("fsmt", "merges.txt", ()), ("fsmt", "vocab-src.json", ()), ("fsmt", "vocab-tgt.json", ()),
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


# FSMT: Moses' rules before and after fairseq's BPE (quill/models/text/fsmt_tokenizer.py)
FSMT_TEXTS = [
    'He said "hello" to me.', "It's John's book, isn't it?", "the Jones' house and 'single' quotes",
    "a well-known 10-year-old -- or not — maybe – so", "$5.50 costs 20% less: €3,14 or £2", "3.14 and 1,000,000.5",
    "Fenêtre, garçon, Straße, naïve café", "« guillemets » „deutsch“ ‚einfach‘", "ＦＵＬＬ：ｗｉｄｔｈ！？（１２３）",
    "。日本語、句読点。　全角", "漢字 and 🙂 emoji ☃", "control\x00char\x07bell\u200bzero-width\ufeffbom",
    "tab\tnew\nline\r\nend", "non\u00a0breaking\u2009thin\u202fspaces", "e-mail me@example.com http://a.b/c?d=e&f",
    "<b>html</b> &amp; [x] {y} | z", "</s> in the middle <unk> and <s><pad>", "U.S.A. e.g. Mr. Smith",
    "don't won't can't I'm you're we've", "wir sehen dich morgen früh!", "… ellipsis … and ...", "'''", '""',
    "``quoted''", "a—b–c‐d", "100 % sure, 5 km/h", "x", "", "  ", "ALL CAPS Title Case lower",
]


def test_fsmt_source_ids_for_moses_punctuation_quotes_and_unknown_characters(families):
    family = families("fsmt")
    ref = family.reference()
    for text in FSMT_TEXTS:
        assert family.quill.source_ids(text, "en", "de") == ref(text)["input_ids"], text


@pytest.mark.parametrize("langs, lower", [(("de", "en"), False), (("en", "de"), True)])
def test_fsmt_other_languages_and_lower_case(tmp_path, langs, lower):
    """Moses' rules follow the pair (German's, not English's, on the source); do_lower_case lowercases the source
    before them."""
    from transformers import FSMTTokenizer

    write_fsmt_tokenizer(tmp_path, langs)
    if lower:
        config = json.loads((tmp_path / "tokenizer_config.json").read_text())
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": True}))
    quill, ref = load_seq2seq_tokenizer(tmp_path, {"model_type": "fsmt"}), FSMTTokenizer.from_pretrained(tmp_path)
    for text in FSMT_TEXTS + TEXTS:
        assert quill.source_ids(text, *langs) == ref(text)["input_ids"], text
    rng = random.Random(3)
    for _ in range(100):
        ids = [rng.randrange(quill.target.vocab_size) for _ in range(rng.randint(0, 12))]
        assert quill.target.decode(ids) == ref.decode(ids, skip_special_tokens=True), ids


def test_fsmt_bpe_is_fsmt_tokenizers_bpe(families):
    """The merges applied by rank, "</w>" on the last symbol, on words in and out of the training text (characters
    the merges never saw, merges whose result a side's vocabulary lacks)."""
    from quill.models.text.fsmt_tokenizer import FairseqBPE, read_merges

    family = families("fsmt")
    ours, ref = FairseqBPE(read_merges(family.directory / "merges.txt")), family.reference()
    rng = random.Random(4)
    alphabet = list("abcdefghijklmnopqrstuvwxyzäöüßéABCDEÜ0123456789&;.,'@-#漢")
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(2000)]
    words += [w for line in corpus(GERMAN + FRENCH, lines=50, seed=12) for w in line.split()]
    for word in words:
        assert " ".join(ours.split(word)) == ref.bpe(word), word


def test_fsmt_target_encodes_as_the_reversed_pair(families):
    """Stop strings are encoded on the target side: German Moses rules and vocab-tgt.json, no </s>."""
    family = families("fsmt")
    for text in TARGET_TEXTS + FSMT_TEXTS:
        assert family.quill.target.encode(text) == family.target_ids(text)[:-1], text


def test_fsmt_checks_its_language_pair_from_tokenizer_config(families, tmp_path):
    quill = families("fsmt").quill
    assert quill.languages == [] and quill.pair == ("en", "de")
    assert quill.source_ids("la maison", "en", "de") == quill.source_ids("la maison")
    with pytest.raises(ValueError, match="target language 'fr'.*translates en into de only"):
        quill.source_ids("x", "en", "fr")
    copy = _copy_without(families("fsmt").directory, tmp_path)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "langs": ["en"]}))
    with pytest.raises(CheckpointError, match="langs"):
        load_seq2seq_tokenizer(copy, {"model_type": "fsmt"})


_QUOTES = set("'\"`„“”")


def _moses_window_safe(target, ids) -> bool:
    """Whether each Moses rule IncrementalDecoder's few-token windows meet reads the same there as in the whole
    text: no quotes (opening or closing is counted from the start), every word of several BPE pieces letters and
    digits only (a piece alone is read as a word of its own: "," as punctuation, "€" as currency), and "@-@" only
    between words of letters and digits (it joins its neighbours into one word)."""
    words, pieces = [], []
    for i in ids:
        token = target.id_to_token(i)
        if token in ("<s>", "<pad>", "</s>", "<unk>"):
            continue
        pieces.append(token.removesuffix("</w>"))
        if token.endswith("</w>"):
            words.append("".join(pieces) if len(pieces) == 1 else pieces)
            pieces = []
    words += [pieces] if pieces else []
    texts = [w if isinstance(w, str) else "".join(w) for w in words]
    for i, (word, text) in enumerate(zip(words, texts)):
        if _QUOTES & set(text.replace("&quot;", '"').replace("&apos;", "'")):
            return False
        if not isinstance(word, str) and not text.isalnum():
            return False
        if text == "@-@" and not all(t.isalnum() for t in texts[max(i - 1, 0) : i] + texts[i + 1 : i + 2]):
            return False
    return True


def _fsmt_case(target, *tokens):
    return [target.token_to_id(t) for t in tokens]


# (tokens, what decoding them whole gives): cases where Moses reads further than a few tokens
FSMT_WINDOW_CASES = {
    "closing quote": (("das</w>", "&quot;</w>", "brot</w>", "&quot;</w>", "heute</w>"), 'das "brot" heute'),
    "currency ending a word": (("W", "€</w>", "heute</w>"), "W€ heute"),
    "bracket ending a word": (("W", "(</w>", "heute</w>"), "W( heute"),
    "punctuation starting a word": (("heute</w>", ",", "20</w>"), "heute ,20"),
    "@-@ after punctuation": (("heute</w>", "?</w>", "@-@</w>", "brot</w>"), "heute ?-brot"),
}


@pytest.mark.parametrize("case", list(FSMT_WINDOW_CASES))
def test_fsmt_incremental_decoding_where_moses_needs_more_than_a_window(families, case):
    """Where Moses reads more than a few tokens (quotes paired from the start, a word's pieces read as punctuation
    alone), the streamed deltas still add up to the whole decode: Moses-rule targets decode the whole output every
    step and hold back its last word."""
    family = families("fsmt")
    tokens, whole = FSMT_WINDOW_CASES[case]
    target, ref = family.quill.target, family.reference()
    ids = _fsmt_case(target, *tokens)
    assert None not in ids, [t for t, i in zip(tokens, ids) if i is None]
    assert not _moses_window_safe(target, ids)
    assert target.decode(ids) == target.decode_continuation([2], ids) == ref.decode(ids, skip_special_tokens=True)
    assert target.decode(ids) == whole
    decoder = IncrementalDecoder(target, [family.info["decoder_start_token_id"]])
    assert "".join(decoder.push(i) for i in ids) + decoder.flush() == whole
