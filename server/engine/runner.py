"""Scheduled sequences -> one packed forward pass -> next-token logits per sequence.

The only part of the engine that builds tensors: it packs the step's tokens into a
`StepBatch`, runs the model on its state, and hands back one logits row for every
sequence whose tokens are now all computed (and every prompt row for scoring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.batch import StepBatch
from models.checkpoint import LoadedModel

from .sequence import Sequence


@dataclass
class ForwardResult:
    logits: torch.Tensor  # (K, V) float32
    last_row: dict[int, int]  # seq_id -> row of its next-token logits (only sequences now fully computed)
    prompt_rows: dict[int, tuple[int, int]]  # seq_id -> (first row, first position) of all-position logits


class ModelRunner:
    def __init__(self, loaded: LoadedModel, state, cache):
        self.loaded = loaded
        self.model = loaded.model
        self.state = state
        self.cache = cache  # to read block tables / slots
        self.paged = self.model.state_kind == "paged_kv"

    @torch.inference_mode()
    def forward(self, work: list[tuple[Sequence, int]], score_prompt: set[int]) -> ForwardResult:
        """`score_prompt`: ids of sequences that want logits for every prompt position (echo, scoring)."""
        new_tokens, starts, where = [], [], []
        indices, last_row, prompt_rows = [], {}, {}
        offset = 0
        for seq, n in work:
            new_tokens.append(seq.token_ids[seq.num_computed : seq.num_computed + n])
            starts.append(seq.num_computed)
            where.append(self.cache.block_table(seq.seq_id) if self.paged else self.cache.slot(seq.seq_id))
            if seq.seq_id in score_prompt:
                prompt_rows[seq.seq_id] = (len(indices), seq.num_computed)
                indices.extend(range(offset, offset + n))
                if seq.num_computed + n == seq.num_tokens:
                    last_row[seq.seq_id] = len(indices) - 1
            elif seq.num_computed + n == seq.num_tokens:
                last_row[seq.seq_id] = len(indices)
                indices.append(offset + n - 1)
            offset += n
        device = self.loaded.device
        kwargs = dict(block_tables=where) if self.paged else dict(slots=where)
        batch = StepBatch.build(new_tokens, starts, logits="all", device=device, **kwargs)
        batch.logits_indices = torch.tensor(indices, dtype=torch.long, device=device)
        logits = self.model.step(batch, self.state)
        return ForwardResult(logits, last_row, prompt_rows)
