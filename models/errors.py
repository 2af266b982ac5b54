"""The one error a checkpoint that cannot be served raises, naming the file and the problem."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem
