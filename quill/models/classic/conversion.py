"""Converting a classic checkpoint: its format found among the known ones (tried in this order), or named, then
its converter run on the CPU."""

from __future__ import annotations

from pathlib import Path

import torch

from quill.models.loading.errors import CheckpointError

from . import awd_lstm, fairseq_fconv, fairseq_translation, opennmt, word_language_model
from .formats import ClassicFormat, Converted

FORMATS: list[ClassicFormat] = [*word_language_model.FORMATS, *awd_lstm.FORMATS, *fairseq_fconv.FORMATS,
                                *fairseq_translation.FORMATS, *opennmt.FORMATS]


def find_format(path: Path) -> ClassicFormat | None:
    return next((f for f in FORMATS if f.detect(path)), None)


def convert(path: str | Path, vocab: str | Path | None = None, format_name: str | None = None) -> Converted:
    """Read a classic checkpoint (its format detected, or named) into a Quill model and tokenizer."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "no such file or directory")
    if format_name is not None:
        chosen = next((f for f in FORMATS if f.name == format_name), None)
        if chosen is None:
            raise ValueError(f"unknown format {format_name!r} (known: {', '.join(f.name for f in FORMATS)})")
    else:
        chosen = find_format(path)
        if chosen is None:
            raise CheckpointError(path, "not a checkpoint of a known format "
                                        f"(Quill, Hugging Face, {', '.join(f.name for f in FORMATS)})")
    with torch.device("cpu"):
        converted = chosen.convert(path, None if vocab is None else Path(vocab))
    converted.metadata.setdefault("source_format", chosen.name)
    return converted
