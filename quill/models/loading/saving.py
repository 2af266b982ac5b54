"""Writing a Quill checkpoint directory: config.json (architecture, config, end-of-sequence id, metadata),
model.safetensors and tokenizer.json, as `quill.models.loading.checkpoint.load_checkpoint` reads them back.

A module of its own because the classic formats' converter writes what it converts through it, and loading
(checkpoint.py) finds those converted checkpoints (location.py, classic/cache.py): writing depends on neither.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..text.tokenizer import Tokenizer
from .weights import WEIGHTS_FILE

CONFIG_FILE, TOKENIZER_FILE = "config.json", "tokenizer.json"
FORMAT_VERSION = 1


def save_checkpoint(
    directory: str | Path,
    architecture: str,
    model: nn.Module,
    tokenizer: Tokenizer | None,
    dtype: torch.dtype = torch.float16,
    metadata: dict | None = None,
    eos_token_id: int | None = None,
) -> Path:
    """Write a checkpoint directory that `load_checkpoint` reads back. `tokenizer` None: the caller writes the
    tokenizer's files (a converted translation model's rules) and names its `eos_token_id`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "format_version": FORMAT_VERSION,
        "architecture": architecture,
        "config": asdict(model.config),
        "eos_token_id": tokenizer.eos_token_id if tokenizer is not None else eos_token_id,
        "metadata": metadata or {},
    }
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    tensors = {n: p.detach().to("cpu", dtype).contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_FILE)
    return directory
