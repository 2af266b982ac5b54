"""fastai's text rules, as its ULMFiT language models were trained on them, behind Quill's `Tokenizer`.

fastai lowercased every word and marked case with a token before it: `xxmaj` before a capitalised word,
`xxup` before a word in capitals; `xxbos` began each text; runs of a character became `xxrep n c`, of a
word `xxwrep n w`; spaCy split the words. Encoding here applies the same rules, spaCy approximated by a
regex (words; numbers with their decimal points and commas; English contractions split as spaCy does,
"don't" -> "do n't"; every other punctuation character alone; newlines kept as a token where the vocabulary
has one). Decoding undoes them: case restored (and a lone "i" written "I"), repetitions expanded, words joined by spaces
except before closing punctuation and contractions and after opening brackets.

Neither direction fits tokenizers' pipeline (it cannot change the case of a token from the one before),
so this is a `Tokenizer` subclass whose tokenizer.json is only the vocabulary; a checkpoint names these
rules in its config's metadata (`text_rules: fastai`) and load_checkpoint wraps its tokenizer again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from quill.models.text.tokenizer import Tokenizer

UNK, PAD, BOS, EOS, FLD, MAJ, UP, REP, WREP = ("xxunk", "xxpad", "xxbos", "xxeos", "xxfld", "xxmaj", "xxup",
                                               "xxrep", "xxwrep")
MARKERS = (UNK, PAD, BOS, EOS, FLD, MAJ, UP, REP, WREP)

_CHAR_RUN = re.compile(r"(\S)(\1{3,})")  # fastai's replace_rep: four or more of one character
_WORD_RUN = re.compile(r"(?:(?<=\s)|^)(\w+)((?:\s+\1){2,})(?=\s|\W|$)")  # replace_wrep: three or more of one word
_PIECES = re.compile(
    r"\n"
    r"|xx(?:rep|wrep) \d+ \S+"  # what the two rules above produced, kept whole
    r"|\w+(?=n't\b)|n't\b"  # don't -> do n't
    r"|'(?:s|re|ve|m|ll|d)\b"  # it's -> it 's
    r"|\d+(?:[.,]\d+)+"  # 3.14, 1,000
    r"|(?:[a-z]\.){2,}"  # U.S., e.g.
    r"|\w+"
    r"|[^\w\s]",
    re.IGNORECASE,
)
_NO_SPACE_BEFORE = re.compile(r"^(?:[.,;:!?%)\]}]+|n't|'(?:s|re|ve|m|ll|d))$", re.IGNORECASE)
_NO_SPACE_AFTER = {"(", "[", "{", "$", "\n"}


def fastai_tokens(text: str) -> list[str]:
    """`text` as fastai's tokenizer would give it (see the module docstring for how spaCy is approximated)."""
    text = _CHAR_RUN.sub(lambda m: f" {REP} {len(m.group(0))} {m.group(1)} ", text)
    text = _WORD_RUN.sub(lambda m: f" {WREP} {len(m.group(2).split()) + 1} {m.group(1)} ", text)
    tokens = [BOS]
    for piece in _PIECES.findall(text):
        if piece.startswith((REP + " ", WREP + " ")):
            tokens += piece.split(" ")
        elif len(piece) > 1 and piece.isupper():
            tokens += [UP, piece.lower()]
        elif piece[:1].isupper() and piece[1:].islower():
            tokens += [MAJ, piece.lower()]
        else:
            tokens.append(piece.lower())
    return tokens


def fastai_text(tokens: Sequence[str]) -> str:
    """Text from fastai tokens: case markers applied, repetitions expanded, spaced as English is written."""
    words: list[str] = []
    case = None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token in (MAJ, UP):
            case = token
            continue
        if token in (BOS, EOS, PAD, FLD):
            continue
        if token in (REP, WREP):
            if i + 1 >= len(tokens):
                break  # its count and what it repeats are still to come: nothing to show yet
            count, what = (int(tokens[i]) if tokens[i].isdigit() else 1), tokens[i + 1]
            i += 2
            words += [what * count] if token == REP else [what] * count
            continue
        if token == "i" and case is None:
            case = MAJ  # fastai lowercased a lone "I" with no marker; English writes it capitalised
        words.append(token.upper() if case == UP else token.capitalize() if case == MAJ else token)
        case = None
    text = ""
    for word in words:
        if text and not _NO_SPACE_BEFORE.match(word) and text[-1] not in _NO_SPACE_AFTER and word != "\n":
            text += " "
        text += word
    return text


class FastaiTokenizer(Tokenizer):
    """fastai's rules around a word-level tokenizer of its vocabulary (`itos`)."""

    decodes_in_rust = False
    text_rules = "fastai"

    def __init__(self, words: Tokenizer):
        super().__init__(words.hf, words.eos_token_id)
        self._ids = self.hf.get_vocab()
        self._words = {i: w for w, i in self._ids.items()}
        self._unk = self._ids.get(UNK)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        tokens = fastai_tokens(text)[0 if add_special_tokens else 1 :]
        ids = [self._ids.get(t, self._unk) for t in tokens]
        if None in ids:
            raise ValueError(f"{tokens[ids.index(None)]!r} is not in the vocabulary, which has no {UNK}")
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return fastai_text([self._words.get(i, UNK) for i in ids])

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]
