"""The text rules of translation models trained with fairseq or OpenNMT-py, as those toolkits applied them, without
the toolkits: Moses tokenization (sacremoses, escaping as fairseq's `moses` tokenizer does), subword-nmt BPE with
"@@ " continuation marks (or a SentencePiece model), then the model's own vocabulary; and back: ids -> tokens, the
marks joined, Moses detokenization.

A converted toolkit checkpoint describes its rules in `toolkit_tokenizer.json` beside its weights:
    {"toolkit": "fairseq", "source_vocab": [...], "target_vocab": [...],         # tokens by id
     "specials": {"unk": "<unk>", "pad": "<pad>", "bos": "<s>", "eos": "</s>"},
     "source_suffix": ["</s>"],          # tokens appended to every source (fairseq: </s>; OpenNMT: none)
     "languages": ["en", "fr"] | null,   # the one pair it translates (and the Moses rules' languages)
     "moses": true, "lowercase": false,
     "bpe_codes": "bpecodes" | null,     # a subword-nmt (or fastBPE) codes file beside it
     "sentencepiece": {"source": "source.model", "target": "target.model"} | null}
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..loading.errors import CheckpointError, read_json_object
from .rules_target import RulesTarget
from .seq2seq_tokenizer import PairTokenizer

TOOLKIT_TOKENIZER_FILE = "toolkit_tokenizer.json"
END_OF_WORD, CONTINUATION = "</w>", "@@"
SPECIAL_NAMES = ("unk", "pad", "bos", "eos")


def read_bpe_codes(path: Path) -> dict[tuple[str, str], int]:
    """A subword-nmt codes file (an optional "#version: 0.2" line, then one "left right" merge a line) or fastBPE's
    ("left right count"): merge -> rank, a merge listed twice keeping its first rank as subword-nmt does."""
    try:
        lines = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not a readable BPE codes file ({e})") from None
    if lines and lines[0].startswith("#version:"):
        version = lines.pop(0).split()[-1]
        if version != "0.2":
            raise CheckpointError(path, f"BPE codes version {version}: Quill reads version 0.2 (subword-nmt's since "
                                        "2017, and fastBPE's)")
    ranks: dict[tuple[str, str], int] = {}
    for number, line in enumerate(lines):
        fields = line.strip("\r ").split(" ")
        if len(fields) not in (2, 3):
            raise CheckpointError(path, f"line {number + 1} is not a merge 'left right': {line[:80]!r}")
        ranks.setdefault((fields[0], fields[1]), number)
    return ranks


class SubwordBPE:
    """subword-nmt's apply_bpe (codes version 0.2): each word split into characters, the last ending the word
    ("</w>"), adjacent pairs merged lowest rank first; every segment but a word's last marked "@@"."""

    def __init__(self, ranks: dict[tuple[str, str], int]):
        self.ranks = ranks
        self.segments = lru_cache(maxsize=1 << 16)(self._segments)

    def _segments(self, word: str) -> tuple[str, ...]:
        if len(word) == 1:
            return (word,)
        symbols = [*word[:-1], word[-1] + END_OF_WORD]
        while len(symbols) > 1:
            found = [(self.ranks[pair], pair) for pair in zip(symbols, symbols[1:]) if pair in self.ranks]
            if not found:
                break
            left, right = min(found)[1]
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        if symbols[-1] == END_OF_WORD:
            symbols.pop()
        else:
            symbols[-1] = symbols[-1].removesuffix(END_OF_WORD)
        return tuple(symbols)

    def apply(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for word in words:
            if word:
                *head, last = self.segments(word)
                out += [segment + CONTINUATION for segment in head] + [last]
        return out


class ToolkitSide:
    """One side's rules: text -> tokens -> ids (the source), tokens -> text (the target)."""

    def __init__(self, vocab: list[str], unk: str, lang: str | None, moses: bool, bpe: SubwordBPE | None,
                 sentencepiece=None, lowercase: bool = False):
        self.ids: dict[str, int] = {}
        for i, token in enumerate(vocab):
            self.ids.setdefault(token, i)
        self.unk_id = self.ids[unk]
        self.bpe, self.spm, self.lowercase = bpe, sentencepiece, lowercase
        self.moses = self.detokenizer = None
        if moses:  # imported here: sacremoses takes half a second to import
            from sacremoses import MosesDetokenizer, MosesTokenizer

            self.moses, self.detokenizer = MosesTokenizer(lang=lang or "en"), MosesDetokenizer(lang=lang or "en")

    def tokens(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        if self.spm is not None:
            return self.spm.encode(text, out_type=str)
        if self.moses is not None:
            words = self.moses.tokenize(text, aggressive_dash_splits=True, return_str=True, escape=True).split()
        else:
            words = text.split()
        return self.bpe.apply(words) if self.bpe is not None else words

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(token, self.unk_id) for token in self.tokens(text)]

    def detokenize(self, tokens: list[str]) -> str:
        if self.spm is not None:
            return self.spm.decode_pieces(tokens)
        text = " ".join(tokens)
        if self.bpe is not None or CONTINUATION + " " in text + " ":
            text = (text + " ").replace(CONTINUATION + " ", "").rstrip()
        return self.detokenizer.detokenize(text.split()) if self.detokenizer is not None else text


class ToolkitTokenizer(PairTokenizer):
    """A toolkit model's tokenizer: the source's ids with its suffix, the target decoded by its rules. A model whose
    pair is unknown (an OpenNMT file does not say) takes no language names."""

    def __init__(self, pair: tuple[str, str] | None, source: ToolkitSide, target: RulesTarget, suffix: list[int]):
        super().__init__(pair or ("", ""), source.encode, target, target.eos_token_id)
        self.pair = pair
        self.suffix = suffix

    def _check(self, lang: str | None, role: str, required: bool) -> None:
        if self.pair is not None:
            return super()._check(lang, role, required)
        if lang is not None:
            raise ValueError(f"{role} language {lang!r}: this checkpoint names no languages")
        return None

    def source_ids(self, text: str, source_lang: str | None = None, target_lang: str | None = None) -> list[int]:
        self._check(source_lang, "source", required=False)
        self._check(target_lang, "target", required=False)
        return self._encode(text) + self.suffix


def _sentencepiece(directory: Path, name: str):
    import sentencepiece

    path = directory / name
    if not path.is_file():
        raise CheckpointError(path, "missing: the checkpoint's tokenizer needs it")
    return sentencepiece.SentencePieceProcessor(model_file=str(path))


def load_toolkit_tokenizer(directory: Path) -> ToolkitTokenizer:
    """The tokenizer a converted toolkit checkpoint describes in its toolkit_tokenizer.json."""
    path = directory / TOOLKIT_TOKENIZER_FILE
    spec = read_json_object(path)
    try:
        specials = {name: spec["specials"][name] for name in SPECIAL_NAMES}
        source_vocab, target_vocab = list(spec["source_vocab"]), list(spec["target_vocab"])
    except (KeyError, TypeError) as e:
        raise CheckpointError(path, f"no {e} in it") from None
    for side, vocab in (("source", source_vocab), ("target", target_vocab)):
        missing = [specials[n] for n in ("unk", "eos") if specials[n] not in vocab]
        if missing:
            raise CheckpointError(path, f"the {side} vocabulary lacks {', '.join(missing)}")
    pair = tuple(spec["languages"]) if spec.get("languages") else None
    bpe = SubwordBPE(read_bpe_codes(directory / spec["bpe_codes"])) if spec.get("bpe_codes") else None
    spm = spec.get("sentencepiece") or {}
    moses, lower = bool(spec.get("moses")), bool(spec.get("lowercase"))

    def side(vocab: list[str], role: int) -> ToolkitSide:
        model = _sentencepiece(directory, spm[("source", "target")[role]]) if spm else None
        return ToolkitSide(vocab, specials["unk"], pair[role] if pair else None, moses, bpe, model, lower)

    source, target_side = side(source_vocab, 0), side(target_vocab, 1)
    special_ids = {target_side.ids[specials[n]] for n in ("pad", "bos", "eos") if specials[n] in target_side.ids}
    target = RulesTarget(target_side, target_vocab, specials["unk"], special_ids, target_side.ids[specials["eos"]],
                         clean_up=False)
    suffix = [source.ids.get(token, source.unk_id) for token in spec.get("source_suffix", [])]
    return ToolkitTokenizer(pair, source, target, suffix)


def write_toolkit_tokenizer(directory: Path, spec: dict) -> None:
    """Write `spec` (its "bpe_codes" and "sentencepiece" files named by path) as toolkit_tokenizer.json in
    `directory`, those files copied beside it."""
    spec = dict(spec)
    copies: dict[str, Path] = {}
    if spec.get("bpe_codes"):
        copies["bpecodes"] = Path(spec["bpe_codes"])
        spec["bpe_codes"] = "bpecodes"
    if spec.get("sentencepiece"):
        names = {"source": "source.spm", "target": "target.spm"}
        copies.update({names[role]: Path(file) for role, file in spec["sentencepiece"].items()})
        spec["sentencepiece"] = {role: names[role] for role in spec["sentencepiece"]}
    for name, file in copies.items():
        (directory / name).write_bytes(file.read_bytes())
    (directory / TOOLKIT_TOKENIZER_FILE).write_text(json.dumps(spec, ensure_ascii=False) + "\n", encoding="utf-8")
