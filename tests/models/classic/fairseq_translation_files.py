"""fairseq translation checkpoints as fairseq writes them, built by the tests: `model.pt` (a dict with `args` an
argparse.Namespace and `model` the state dict under fairseq's tensor names), `dict.<lang>.txt` for each side and
subword-nmt `bpecodes` learned on a small English text."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import torch
from sacremoses import MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

TEXT = """It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.
"Whose woods these are I think I know." His house is in the village, though; he will not see me stopping here.
A thing of beauty is a joy for ever: its loveliness increases; it will never pass into nothingness.
Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my purse.
"""
SENTENCES = TEXT.splitlines()


def write_bpe(directory: Path) -> list[str]:
    """bpecodes learned on TEXT; returns the BPE pieces TEXT is made of, sorted."""
    moses = MosesTokenizer(lang="en")
    tokenized = [moses.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True) for line in SENTENCES]
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(tokenized)), codes, 120, min_frequency=1)
    (directory / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()))
    return sorted({piece for line in tokenized for piece in bpe.process_line(line).split()})


def write_dictionary(path: Path, words: list[str]) -> None:
    """fairseq's dict.txt: "word count" a line, most frequent first (the four specials are implicit)."""
    path.write_text("".join(f"{w} {1000 - i}\n" for i, w in enumerate(words)), encoding="utf-8")


def dictionary_words(pieces: list[str], rows: int) -> list[str]:
    """`rows` - 4 words: the pieces, then fillers up to the embedding's rows (the four specials come first)."""
    return (pieces + [f"filler{i}" for i in range(rows)])[: rows - 4]


def write_fairseq_checkpoint(directory: Path, state: dict[str, torch.Tensor], arch: str, source_rows: int,
                             target_rows: int, langs=("en", "de"), **args) -> list[str]:
    """model.pt, both dictionaries and bpecodes in `directory`; returns the BPE pieces."""
    directory.mkdir(parents=True, exist_ok=True)
    pieces = write_bpe(directory)
    write_dictionary(directory / f"dict.{langs[0]}.txt", dictionary_words(pieces, source_rows))
    write_dictionary(directory / f"dict.{langs[1]}.txt", dictionary_words(pieces, target_rows))
    namespace = argparse.Namespace(arch=arch, task="translation", source_lang=langs[0], target_lang=langs[1],
                                   tokenizer="moses", bpe="subword_nmt", **args)
    torch.save({"args": namespace, "model": state, "optimizer_history": [{"criterion_name": "x", "num_updates": 1}],
                "extra_state": {"epoch": 1}, "last_optimizer_state": None}, directory / "model.pt")
    return pieces
