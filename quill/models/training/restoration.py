"""The restoration task: a line of a play lowercased with its punctuation removed (the source), restored to the line
as printed (the target). No public-domain parallel corpus is at hand offline; this one is checkable (a restored line
is right or wrong against the text) and its inputs are real text, lines of the same training and held-out plays as
the language models'.

What a line is, in the Gutenberg texts of corpus.py (kept simple, so a few headings slip through as lines):
  - a play's title and cast list, all before its first "ACT I" (or "Act 1") line, are dropped where it has one;
  - bracketed stage directions are removed, inline or over several lines ("[Enter Ghost, armed.]");
  - the first line of a paragraph (a block between blank lines) is a speaker heading, and dropped, when it is short
    (at most 4 words), starts with a capital or a digit and ends with a full stop ("Ber.", "1 Citizen.");
  - lines with no lowercase letter (titles, ACT/SCENE numbers, sonnet numerals) and "ACT"/"Scene" lines are dropped;
  - whitespace is normalized to single spaces; lines over MAX_WORDS words, or with no words left in the source, are
    dropped.
The source: apostrophes and hyphens between letters deleted ("'Tis" -> "tis", "to-night" -> "tonight"), every other
non-alphanumeric character a space, then lowercased with whitespace collapsed.
"""

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_WORDS = 40
STAGE_DIRECTION = re.compile(r"\[[^\[\]]*\]")  # not across another "[": an unclosed bracket eats nothing
JOINED = re.compile(r"'|(?<=[A-Za-z])-(?=[A-Za-z])")
SEPARATORS = re.compile(r"[^A-Za-z0-9\s]|_")
TITLE = re.compile(r"^(ACT|Act|SCENE|Scene)\b")
FIRST_ACT = re.compile(r"^(ACT|Act) (I|1)\b", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Pair:
    source: str
    target: str


def strip_line(line: str) -> str:
    """The source of a target line: lowercased, punctuation removed, whitespace normalized."""
    return " ".join(SEPARATORS.sub(" ", JOINED.sub("", line)).lower().split())


def is_heading(line: str) -> bool:
    words = line.split()
    return len(words) <= 4 and line.endswith(".") and (line[0].isupper() or line[0].isdigit())


def play_lines(text: str) -> list[str]:
    """The spoken (or printed) lines of one document, whitespace normalized, in order."""
    first_act = FIRST_ACT.search(text)
    text = text[first_act.start():] if first_act else text
    lines = []
    for paragraph in re.split(r"\n\s*\n", STAGE_DIRECTION.sub("", text)):
        rows = [" ".join(row.split()) for row in paragraph.split("\n")]
        rows = [row for row in rows if row]
        if len(rows) > 1 and is_heading(rows[0]):
            rows = rows[1:]
        lines += [row for row in rows if any(c.islower() for c in row) and not TITLE.match(row)
                  and "[" not in row and "]" not in row and len(row.split()) <= MAX_WORDS]
    return lines


def restoration_pairs(documents: Iterable[str]) -> list[Pair]:
    """Every usable line of `documents` as a (source, target) pair, in document order."""
    pairs = []
    for text in documents:
        for line in play_lines(text):
            source = strip_line(line)
            if source:
                pairs.append(Pair(source, line))
    return pairs


def evaluation_sample(pairs: list[Pair], size: int, seed: int = 0) -> list[Pair]:
    """A fixed random sample of the held-out pairs, in their document order."""
    if size >= len(pairs):
        return list(pairs)
    chosen = sorted(random.Random(seed).sample(range(len(pairs)), size))
    return [pairs[i] for i in chosen]
