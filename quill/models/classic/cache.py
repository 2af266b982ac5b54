"""Classic checkpoints served as they are: converted once into a Quill checkpoint directory under a cache.

`quill serve --model PATH` and `quill generate --model PATH` take the original files (the model file, or
the directory holding it and its vocabulary). They are converted into `<cache>/classic/<key>`, the key a
hash of the format, the conversion's version and the bytes of every file it reads, so a changed file
converts again and an unchanged one loads from the cache; the directory appears whole (written aside,
then renamed), so a second process that loads it (--engine-process) reads what the first wrote.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .conversion import convert, find_format
from .formats import ClassicFormat

CONVERSION_VERSION = 2  # bump when a conversion's output changes, so old cache entries are not reused
CHUNK = 1 << 20


def cache_dir() -> Path:
    """$QUILL_CACHE_DIR, else $XDG_CACHE_HOME/quill (~/.cache/quill)."""
    env = os.environ
    if env.get("QUILL_CACHE_DIR"):
        return Path(env["QUILL_CACHE_DIR"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg).expanduser() / "quill"


def _files(paths: list[Path]) -> list[Path]:
    files = []
    for path in paths:
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return files


def conversion_key(chosen: ClassicFormat, path: Path, vocab: Path | None) -> str:
    read = chosen.inputs(path, vocab) if chosen.inputs else [path] + ([vocab] if vocab is not None else [])
    digest = hashlib.sha256(f"{chosen.name}\0{CONVERSION_VERSION}".encode())
    for file in _files(read):
        digest.update(f"\0{file.name}\0".encode())
        with open(file, "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
    return digest.hexdigest()[:32]


def converted_checkpoint(path: str | Path, vocab: str | Path | None = None) -> Path | None:
    """The Quill checkpoint directory a classic checkpoint converts to (converted now unless cached), or
    None if `path` is no classic format's."""

    path, vocab = Path(path), None if vocab is None else Path(vocab)
    chosen = find_format(path)
    if chosen is None:
        return None
    target = cache_dir() / "classic" / conversion_key(chosen, path, vocab)
    if (target / "config.json").is_file():
        return target
    converted = convert(path, vocab, chosen.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        converted.save(staging, torch.float32, metadata={**converted.metadata, "source": str(path.resolve())})
        os.replace(staging, target)
    except OSError:
        if not (target / "config.json").is_file():  # not another process's conversion that won the rename
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
