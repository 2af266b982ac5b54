"""How an engine splits its model: over how many ranks, and who starts them."""

from __future__ import annotations

from dataclasses import dataclass

WORKER_STARTS = ("spawn", "external")


@dataclass
class ParallelConfig:
    size: int = 1  # tensor-parallel ranks; 1: the whole model on one device
    # "spawn": rank 0 starts the other ranks on its machine (one CUDA device each, after its own); "external": they
    # are started apart (`quill tp-worker`, e.g. on other machines) and meet rank 0 at MASTER_ADDR:MASTER_PORT
    workers: str = "spawn"

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"the tensor-parallel size must be at least 1, not {self.size}")
        if self.workers not in WORKER_STARTS:
            raise ValueError(f"tensor-parallel workers must be one of {WORKER_STARTS}, not {self.workers!r}")
