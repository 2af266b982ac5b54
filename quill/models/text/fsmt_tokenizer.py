"""FSMT's tokenizer (fairseq's WMT19 Transformers, transformers' FSMTTokenizer) without transformers.

Source text: Moses clean-up (unicode punctuation, punctuation normalization, non-printing characters) and Moses
tokenization for the source language, then fairseq's BPE (subword-nmt merges, "</w>" ending a word), ids from
vocab-src.json, "</s>" appended. Target ids: vocab-tgt.json's tokens joined, "</w>" read as a space, then Moses
detokenization for the target language. One merges.txt serves both sides (fairseq's joint BPE), so a merge may make
a token that one side's vocabulary lacks: it becomes <unk> there, as in transformers.

Moses detokenization reads whole words and counts quotes from the start, so the target side (rules_target.py)
streams by decoding the whole output at each token and holding back its last word.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from pathlib import Path

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from ..loading.errors import CheckpointError, read_json_object
from .sentencepiece_vocab import added_token_pattern, vocab_layout
from .rules_target import RulesTarget

SOURCE_VOCAB, TARGET_VOCAB, MERGES = "vocab-src.json", "vocab-tgt.json", "merges.txt"
END_OF_WORD = "</w>"
# FSMTTokenizer's special tokens by default (it has no eos_token: "</s>" ends a source as its sep_token)
DEFAULTS = {"bos_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}

# Moses' replace-unicode-punctuation, as FSMTTokenizer ports it: one character for another (a string for "…"),
# and the two full stops that also swallow the spaces after them.
_UNICODE_PUNCT = str.maketrans({
    "，": ",", "、": ",", "”": '"', "“": '"', "∶": ":", "：": ":", "？": "?", "《": '"', "》": '"', "）": ")",
    "！": "!", "（": "(", "；": ";", "」": '"', "「": '"', "～": "~", "’": "'", "…": "...", "━": "-", "〈": "<",
    "〉": ">", "【": "[", "】": "]", "％": "%", **{chr(0xFF10 + d): str(d) for d in range(10)},
})
_FULL_STOPS = re.compile(r"[。．]\s*")


def _moses_clean(text: str, normalizer: MosesPunctNormalizer) -> str:
    text = _FULL_STOPS.sub(". ", text).translate(_UNICODE_PUNCT)
    text = normalizer.normalize(text)
    return "".join(c for c in text if not unicodedata.category(c).startswith("C"))  # Moses' non-printing chars


def read_merges(path: Path) -> dict[tuple[str, ...], int]:
    """merges.txt as FSMTTokenizer reads it: every line but the last (the empty one after the final newline), its
    first two fields; a pair listed twice keeps its later rank."""
    if not path.is_file():
        raise CheckpointError(path, "missing: the checkpoint's tokenizer needs it")
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return dict(zip((tuple(line.split()[:2]) for line in lines), range(len(lines))))


class FairseqBPE:
    """Word -> subword tokens by merge rank, the lowest-ranked adjacent pair first, all its occurrences left to
    right, the last symbol carrying "</w>" (FSMTTokenizer.bpe, which subword-nmt's apply_bpe also does)."""

    def __init__(self, ranks: dict[tuple[str, ...], int]):
        self.ranks = ranks
        self.split = lru_cache(maxsize=1 << 16)(self._split)

    def _split(self, word: str) -> tuple[str, ...]:
        symbols = [*word[:-1], word[-1] + END_OF_WORD]
        ranks = self.ranks
        while len(symbols) > 1:
            rank, (left, right) = min((ranks.get(pair, float("inf")), pair) for pair in zip(symbols, symbols[1:]))
            if rank == float("inf"):
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return tuple(symbols)


class MosesSide:
    """One language's Moses text rules over the shared BPE and that side's vocabulary: text -> ids as
    FSMTTokenizer's source side makes them, and tokens -> text as its decode does."""

    def __init__(self, lang: str, bpe: FairseqBPE, vocab: dict[str, int], unk_id: int, specials: dict[str, int],
                 lower: bool):
        self.lang, self.bpe, self.vocab, self.unk_id, self.lower = lang, bpe, vocab, unk_id, lower
        self.specials = specials  # special token -> id: cut out of the text before Moses sees it, as transformers does
        self.pattern = added_token_pattern(specials)
        self.normalizer = MosesPunctNormalizer(lang=lang)
        self.moses = MosesTokenizer(lang=lang)
        self.detokenizer = MosesDetokenizer(lang=lang)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        chunks = self.pattern.split(text) if self.pattern else [text]
        for i, chunk in enumerate(chunks):
            if i % 2:  # re.split puts the matched special tokens at odd positions
                ids.append(self.specials[chunk])
            elif chunk:
                ids += [self.vocab.get(token, self.unk_id) for token in self.tokens(chunk)]
        return ids

    def tokens(self, text: str) -> list[str]:
        if self.lower:
            text = text.lower()
        words = self.moses.tokenize(_moses_clean(text, self.normalizer), aggressive_dash_splits=True,
                                    return_str=False, escape=True)
        return [token for word in words if word for token in self.bpe.split(word)]

    def detokenize(self, tokens: list[str]) -> str:
        words = "".join(t.replace(" ", "").replace(END_OF_WORD, " ") for t in tokens).split()
        return self.detokenizer.detokenize(words)


def _vocab(path: Path) -> tuple[dict[str, int], list[str]]:
    if not path.is_file():
        raise CheckpointError(path, "missing: the checkpoint's tokenizer needs it")
    vocab = read_json_object(path)
    return vocab, vocab_layout(vocab, path)


def load_fsmt(directory: Path, tok_config: dict, special: dict[str, str]) -> tuple[tuple[str, str], MosesSide,
                                                                                   RulesTarget, int]:
    """(the language pair, the source side, the target Tokenizer, the id that ends a source) of the FSMT checkpoint
    in `directory`; `tok_config` is its tokenizer_config.json, `special` its named special tokens."""
    langs = tok_config.get("langs")
    if not (isinstance(langs, list) and len(langs) == 2 and all(isinstance(c, str) and c for c in langs)):
        raise CheckpointError(directory / "tokenizer_config.json",
                              f"FSMT needs langs, its language pair such as [\"en\", \"de\"] (found {langs!r})")
    source_path, target_path = directory / SOURCE_VOCAB, directory / TARGET_VOCAB
    source_vocab, _ = _vocab(source_path)
    target_vocab, layout = _vocab(target_path)
    bpe = FairseqBPE(read_merges(directory / MERGES))
    names = {**DEFAULTS, **special}  # transformers treats every named special token alike
    for path, vocab in ((source_path, source_vocab), (target_path, target_vocab)):
        for name in ("unk_token", "sep_token"):
            if names[name] not in vocab:
                raise CheckpointError(path, f"the vocabulary has no {names[name]!r} token ({name})")
    lower = bool(tok_config.get("do_lower_case", False))

    def side(lang: str, vocab: dict[str, int]) -> MosesSide:
        # transformers cuts the special tokens out of the text before Moses sees it
        specials = {t: vocab[t] for t in names.values() if t in vocab}
        return MosesSide(lang, bpe, vocab, vocab[names["unk_token"]], specials, lower)

    source, target_side = side(langs[0], source_vocab), side(langs[1], target_vocab)
    # decode skips the target's own special ids (transformers skips the source vocabulary's ids of the same
    # tokens: fairseq gives both dictionaries <s> 0, <pad> 1, </s> 2, <unk> 3, so they agree)
    target = RulesTarget(target_side, layout, names["unk_token"], set(target_side.specials.values()),
                        target_vocab[names["sep_token"]], bool(tok_config.get("clean_up_tokenization_spaces")))
    return (langs[0], langs[1]), source, target, source_vocab[names["sep_token"]]
