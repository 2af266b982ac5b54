"""The tokenizer of an encoder-decoder (translation) checkpoint, read from the files the hub ships, without
transformers: encoder input ids as transformers' tokenizer(text) makes them, and a target-side `Tokenizer` that
decodes generated ids (incrementally, through tokenizers' DecodeStream) and encodes stop strings.

Families and where their language goes:
- Marian (opus-mt): source.spm/target.spm pieces through vocab.json (target_vocab.json with separate_vocabs);
  a multilingual one picks its target by a ">>fra<<" token at the start of the source.
- M2M100: sentencepiece.bpe.model pieces through vocab.json, "__fr__" tokens after the vocabulary;
  source = [source language] text </s>, the target language forced as the decoder's first token.
- NLLB-200 (model_type m2m_100, NllbTokenizer), mBART-50, mBART: tokenizer.json, language tokens such as
  "fra_Latn" or "fr_XX"; NLLB and mBART-50 put the source language first, mBART (and legacy NLLB) last.
- BART: <s> text </s>; T5: text </s>; no language tokens.
- FSMT (fairseq's WMT19): Moses rules and BPE (fsmt_tokenizer.py), text </s>; one language pair, unmarked.
Marian and M2M100 are SentencePiece-only in transformers (no tokenizer.json on the hub); the others use
tokenizer.json, or their SentencePiece model when a checkpoint lacks it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from ..loading.errors import CheckpointError, read_json_object
from .sentencepiece_vocab import (SentencePieceEncoder, SentencePieceModel, read_sentencepiece, spm_tokenizer,
                                  vocab_layout)
from .tokenizer import Tokenizer
from .tokenizer_config import TOKENIZER_CONFIG_FILE, read_tokenizer_config

TOKENIZER_FILE = "tokenizer.json"

# transformers' M2M100Tokenizer numbers its language tokens after vocab.json in this order (FAIRSEQ_LANGUAGE_CODES).
M2M100_LANGUAGES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi "
               "hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns "
               "oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh "
               "zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
# mBART's 25 language codes, then mBART-50's 25 more: after the pieces when a checkpoint has no tokenizer.json.
MBART50_LANGUAGES = ("ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT "
                     "lv_LV my_MM ne_NP nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL "
                     "hr_HR id_ID ka_GE km_KH mk_MK ml_IN mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN "
                     "th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES sl_SI").split()
MBART_LANGUAGE_COUNT = 25
# How language tokens look, to find them among a tokenizer.json's added tokens.
LANGUAGE_TOKEN = {"nllb": re.compile(r"[a-z]{3}_[A-Z][a-z]{3}"), "mbart": re.compile(r"[a-z]{2}_[A-Z]{2}")}
SPM_FILES = {"t5": "spiece.model", "mbart": "sentencepiece.bpe.model", "nllb": "sentencepiece.bpe.model"}

# Where a family's tokens go around the text: "prefix" [source language] text </s> (M2M100, NLLB, mBART-50),
# "suffix" text </s> [source language] (mBART, legacy NLLB), "marian" [">>target<<"] text </s>,
# "bart" <s> text </s>, "t5" text </s>.
LANGUAGE_STYLES = ("prefix", "suffix")


class Seq2SeqTokenizer:
    """Encoder input ids for a text and its languages, the decoder's forced first ids, and the target-side
    `Tokenizer` (`target`) that decodes generated ids. `languages`: the codes the checkpoint takes, as users
    name them ("fra" for Marian's ">>fra<<", "fr" for M2M100's "__fr__", "fra_Latn", "fr_XX"); [] if none."""

    def __init__(self, style: str, encode: Callable[[str], list[int]], target: Tokenizer,
                 languages: dict[str, int], eos_id: int, bos_id: int | None = None):
        self.style = style
        self._encode = encode
        self.target = target
        self._language_ids = languages  # code as users name it -> token id (Marian: of ">>code<<")
        self.languages: list[str] = list(languages)
        self._eos_id, self._bos_id = eos_id, bos_id
        # the pair tokenizer_config.json declares (Marian's source_lang, target_lang), as written: unchecked codes
        self.declared_pair: tuple[object, object] = (None, None)

    def _check(self, lang: str | None, role: str, required: bool) -> int | None:
        """The token id of `lang`; a ValueError naming the known codes for one the checkpoint lacks."""
        if lang is None:
            if required:
                raise ValueError(f"this checkpoint needs a {role} language, one of: {', '.join(self.languages)}")
            return None
        if not self.languages:
            raise ValueError(f"{role} language {lang!r}: this checkpoint takes no language codes")
        if lang not in self._language_ids:
            raise ValueError(f"unknown {role} language {lang!r}; this checkpoint knows: {', '.join(self.languages)}")
        return self._language_ids[lang]

    def source_ids(self, text: str, source_lang: str | None = None, target_lang: str | None = None) -> list[int]:
        """Encoder input ids as transformers' tokenizer(text) makes them with src_lang/tgt_lang set (a Marian
        multilingual target as ">>code<< " before the text), special tokens included. Marian checkpoints do not
        mark the source language: source_lang is ignored there."""
        if self.style == "marian":
            if self._check(target_lang, "target", required=False) is not None:
                text = f">>{target_lang}<< {text}"
            return self._encode(text) + [self._eos_id]
        if self.style in LANGUAGE_STYLES:
            source = self._check(source_lang, "source", required=True)
            self._check(target_lang, "target", required=False)
            if self.style == "prefix":
                return [source] + self._encode(text) + [self._eos_id]
            return self._encode(text) + [self._eos_id, source]
        self._check(source_lang, "source", required=False)
        self._check(target_lang, "target", required=False)
        bos = [self._bos_id] if self.style == "bart" and self._bos_id is not None else []
        return bos + self._encode(text) + [self._eos_id]

    def target_prefix(self, target_lang: str | None) -> list[int]:
        """The ids the decoder starts with after decoder_start_token_id: the target language's token where the
        checkpoint forces it (transformers' forced_bos_token_id), else none."""
        if self.style in LANGUAGE_STYLES:
            return [self._check(target_lang, "target", required=True)]
        self._check(target_lang, "target", required=False)
        return []


class PairTokenizer(Seq2SeqTokenizer):
    """A checkpoint of one language pair that no token marks (FSMT: tokenizer_config.json's `langs`): text </s>.
    `languages` stays []; a caller may name the pair's own languages, and no others."""

    def __init__(self, pair: tuple[str, str], encode: Callable[[str], list[int]], target: Tokenizer, eos_id: int):
        super().__init__("pair", encode, target, {}, eos_id)
        self.pair = pair

    def _check(self, lang: str | None, role: str, required: bool) -> None:
        if lang is not None and lang != self.pair[role == "target"]:
            raise ValueError(f"{role} language {lang!r}: this checkpoint translates {self.pair[0]} into "
                             f"{self.pair[1]} only")
        return None


def _json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(path, "missing: the checkpoint's tokenizer needs it")
    return read_json_object(path)


def _token_id(ids: dict[str, int], token: str, path: Path) -> int:
    if token not in ids:
        raise CheckpointError(path, f"the vocabulary has no {token!r} token")
    return ids[token]


def _added_tokens(tok_config: dict, special: dict[str, str]) -> list[str]:
    """The strings transformers cuts the text at before tokenizing, in order: the named special tokens, the added
    tokens tokenizer_config.json lists by id, then its additional (extra) special tokens."""
    strings = list(special.values())
    decoder = tok_config.get("added_tokens_decoder") or {}
    for _, entry in sorted((int(i), e) for i, e in decoder.items() if str(i).isdigit()):
        strings.append(entry.get("content") if isinstance(entry, dict) else None)
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = tok_config.get(key)
        if isinstance(value, list):
            strings += [t if isinstance(t, str) else t.get("content") for t in value if isinstance(t, (str, dict))]
    return list(dict.fromkeys(s for s in strings if isinstance(s, str) and s))


def _load_marian(directory: Path, tok_config: dict, special: dict[str, str]) -> Seq2SeqTokenizer:
    vocab_path = directory / "vocab.json"
    vocab = _json(vocab_path)
    vocab_layout(vocab, vocab_path)
    target_path = directory / "target_vocab.json"
    target_vocab = _json(target_path) if tok_config.get("separate_vocabs") else vocab
    target_layout = vocab_layout(target_vocab, target_path)
    source_spm = read_sentencepiece(directory / "source.spm")
    target_spm = read_sentencepiece(directory / "target.spm")
    unk, eos = special.get("unk_token", "<unk>"), special.get("eos_token", "</s>")
    pad = special.get("pad_token", "<pad>")
    added = {t: vocab[t] for t in _added_tokens(tok_config, special) if t in vocab}
    encoder = SentencePieceEncoder(source_spm, vocab, _token_id(vocab, unk, vocab_path), added, language_codes=True)
    target_specials = [t for t in (eos, unk, pad, *added) if t in target_vocab]
    target = spm_tokenizer(target_layout, target_spm, unk, target_specials, "sentencepiece")
    languages = {token[2:-2]: i for token, i in sorted(vocab.items(), key=lambda item: item[1])
                 if token.startswith(">>") and token.endswith("<<") and len(token) > 4}
    target_eos = _token_id(target_vocab, eos, target_path if target_vocab is not vocab else vocab_path)
    return Seq2SeqTokenizer("marian", encoder.encode, Tokenizer(target, target_eos), languages,
                            _token_id(vocab, eos, vocab_path))


def _load_m2m100(directory: Path, tok_config: dict, special: dict[str, str]) -> Seq2SeqTokenizer:
    vocab_path = directory / "vocab.json"
    vocab = _json(vocab_path)
    layout = vocab_layout(vocab, vocab_path)
    spm = read_sentencepiece(directory / "sentencepiece.bpe.model")
    codes = M2M100_LANGUAGES.get(tok_config.get("language_codes", "m2m100"))
    if codes is None:
        raise CheckpointError(directory / TOKENIZER_CONFIG_FILE,
                              f"language_codes must be one of {', '.join(M2M100_LANGUAGES)}")
    languages = {code: len(layout) + i for i, code in enumerate(codes)}
    # fairseq pads the dictionary with "madeup words" that the embedding covers; they decode to nothing here
    madeup = [f"madeupword{i:04d}" for i in range(int(tok_config.get("num_madeup_words", 8)))]
    unk, eos = special.get("unk_token", "<unk>"), special.get("eos_token", "</s>")
    added = {t: vocab[t] for t in _added_tokens(tok_config, special) if t in vocab}
    encoder = SentencePieceEncoder(spm, vocab, _token_id(vocab, unk, vocab_path), added)
    lang_tokens = [f"__{code}__" for code in codes]
    # Language tokens decode to nothing, as in transformers 4 (transformers 5 no longer marks them special and
    # writes "__fr__" into the text)
    target = spm_tokenizer(layout + lang_tokens + madeup, spm, unk, [*added, *lang_tokens, *madeup],
                           "sentencepiece")
    eos_id = _token_id(vocab, eos, vocab_path)
    return Seq2SeqTokenizer("prefix", encoder.encode, Tokenizer(target, eos_id), languages, eos_id)


def _tokenizer_json_languages(hf: HFTokenizer, kind: str) -> dict[str, int]:
    pattern = LANGUAGE_TOKEN[kind]
    return {token: i for i, token in sorted((i, t.content) for i, t in hf.get_added_tokens_decoder().items()
                                            if t.special and pattern.fullmatch(t.content))}


def _bart_from_vocab(directory: Path, tok_config: dict) -> HFTokenizer:
    """Byte-level BPE from vocab.json and merges.txt, for a BART checkpoint that ships no tokenizer.json, as
    transformers' RobertaTokenizer builds it."""
    from tokenizers import decoders, pre_tokenizers

    for name in ("vocab.json", "merges.txt"):
        if not (directory / name).is_file():
            raise CheckpointError(directory / TOKENIZER_FILE, f"missing, and so is {name} to build it from")
    hf = HFTokenizer(BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(tok_config.get("add_prefix_space", False)))
    hf.decoder = decoders.ByteLevel()
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    hf.add_special_tokens([t for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>") if t in vocab])
    return hf


def _spm_layout(kind: str, spm: SentencePieceModel, tok_config: dict, directory: Path) -> tuple[list[str], list[str]]:
    """A tokenizers-backed family's vocabulary as transformers builds it from the SentencePiece model alone:
    (tokens in id order, the language codes among them). The tokens after the pieces sit where
    tokenizer_config.json's added_tokens_decoder puts them, else in the family's own order."""
    if kind == "t5":
        base = list(spm.pieces)
        extra = [f"<extra_id_{i}>" for i in range(int(tok_config.get("extra_ids", 100)) - 1, -1, -1)]
    else:  # fairseq's layout: its four specials first, the pieces after <unk>/<s>/</s> shifted by one
        base = ["<s>", "<pad>", "</s>", "<unk>"] + spm.pieces[3:]
        if kind == "mbart":
            codes = MBART50_LANGUAGES if tok_config["tokenizer_class"].startswith("MBart50") else (
                MBART50_LANGUAGES[:MBART_LANGUAGE_COUNT])
        else:  # NLLB's 202 codes are not kept here: a checkpoint without tokenizer.json must list them
            codes = [c for c in _added_tokens(tok_config, {}) if LANGUAGE_TOKEN["nllb"].fullmatch(c)]
        extra = list(codes) + ["<mask>"]
    placed = {}
    for key, entry in (tok_config.get("added_tokens_decoder") or {}).items():
        if str(key).isdigit() and int(key) >= len(base) and isinstance(entry, dict):
            placed[int(key)] = entry.get("content")
    if placed and sorted(placed) == list(range(len(base), len(base) + len(placed))):
        extra = [placed[i] for i in sorted(placed)]
    codes = [t for t in extra if kind != "t5" and LANGUAGE_TOKEN[kind].fullmatch(t)]
    if kind == "nllb" and not codes:
        raise CheckpointError(directory / TOKENIZER_FILE, "missing (the NLLB language codes are read from it)")
    return base + extra, codes


def _load_tokenizers_family(directory: Path, kind: str, tok_config: dict, special: dict[str, str],
                            style: str) -> Seq2SeqTokenizer:
    unk, eos = special.get("unk_token", "<unk>"), special.get("eos_token", "</s>")
    if (directory / TOKENIZER_FILE).is_file():
        try:
            hf = HFTokenizer.from_file(str(directory / TOKENIZER_FILE))
        except Exception as e:  # tokenizers raises a bare Exception
            raise CheckpointError(directory / TOKENIZER_FILE, f"not a tokenizers file ({e})") from None
        languages = _tokenizer_json_languages(hf, kind) if kind in LANGUAGE_TOKEN else {}
    elif kind == "bart":
        hf, languages = _bart_from_vocab(directory, tok_config), {}
    else:  # what transformers builds from the SentencePiece model when there is no tokenizer.json
        spm = read_sentencepiece(directory / SPM_FILES[kind])
        layout, codes = _spm_layout(kind, spm, tok_config, directory)
        ids = {token: i for i, token in enumerate(layout)}
        specials = [t for t in (*_added_tokens(tok_config, special), *codes) if t in ids]
        pipeline = "t5" if kind == "t5" else "mbart" if kind == "mbart" and style == "suffix" else "fairseq"
        mask = [special.get("mask_token", "<mask>")] if kind != "t5" else []
        hf = spm_tokenizer(layout, spm, unk, specials, pipeline, bpe=kind == "nllb", lstrip=mask,
                           normalized=mask if kind == "nllb" else [])
        languages = {code: ids[code] for code in codes}
    # The family's rules below add the special tokens; nothing in the file may add, cut or pad.
    hf.post_processor = None
    hf.no_truncation()
    hf.no_padding()
    eos_id = hf.token_to_id(eos)
    if eos_id is None:
        raise CheckpointError(directory / TOKENIZER_FILE, f"has no end-of-sequence token {eos!r}")

    def encode(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False).ids

    bos_id = hf.token_to_id(special.get("bos_token", "<s>"))
    return Seq2SeqTokenizer(style, encode, Tokenizer(hf, eos_id), languages, eos_id, bos_id)


def load_seq2seq_tokenizer(directory: Path, config: dict) -> Seq2SeqTokenizer:
    """The tokenizer of the encoder-decoder checkpoint in `directory`; `config` is its parsed config.json.
    A CheckpointError names a file the tokenizer needs that is missing or unreadable."""
    directory = Path(directory)
    tok_config = read_json_object(directory / TOKENIZER_CONFIG_FILE) if (
        directory / TOKENIZER_CONFIG_FILE).is_file() else {}
    tokenizer = _load_family(directory, config, tok_config)
    tokenizer.declared_pair = (tok_config.get("source_lang"), tok_config.get("target_lang"))
    return tokenizer


def _load_family(directory: Path, config: dict, tok_config: dict) -> Seq2SeqTokenizer:
    special = read_tokenizer_config(directory).special_tokens
    # Which transformers class reads the tokenizer: tokenizer_config.json says, else config.json may
    tokenizer_class = str(tok_config.get("tokenizer_class") or config.get("tokenizer_class") or "")
    tok_config = {**tok_config, "tokenizer_class": tokenizer_class}
    model_type = config.get("model_type")
    if model_type == "marian":
        return _load_marian(directory, tok_config, special)
    if model_type == "m2m_100":
        if tokenizer_class.startswith("Nllb"):
            style = "suffix" if tok_config.get("legacy_behaviour") else "prefix"
            return _load_tokenizers_family(directory, "nllb", tok_config, special, style)
        return _load_m2m100(directory, tok_config, special)
    if model_type == "mbart":  # mBART-50 puts the source language first, mBART (cc25) last
        style = "prefix" if tokenizer_class.startswith("MBart50") else "suffix"
        return _load_tokenizers_family(directory, "mbart", tok_config, special, style)
    if model_type == "bart":
        return _load_tokenizers_family(directory, "bart", tok_config, special, "bart")
    if model_type in ("t5", "mt5", "umt5"):
        return _load_tokenizers_family(directory, "t5", tok_config, special, "t5")
    if model_type == "fsmt":  # imported here: sacremoses takes half a second to import
        from .fsmt_tokenizer import load_fsmt

        pair, source, target, eos_id = load_fsmt(directory, tok_config, special)
        return PairTokenizer(pair, source.encode, target, eos_id)
    raise CheckpointError(directory / "config.json", f"model_type {model_type!r} is not an encoder-decoder family "
                          "whose tokenizer Quill reads (marian, m2m_100, mbart, bart, t5, mt5, umt5, fsmt)")
