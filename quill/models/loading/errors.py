"""The one error a checkpoint that cannot be served raises, naming the file and the problem, and the one
reader of a checkpoint's JSON files that raises it."""

from __future__ import annotations

import json
from pathlib import Path


class CheckpointError(Exception):
    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object (config.json, generation_config.json, tokenizer_config.json)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(path, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(path, "must hold a JSON object")
    return raw
