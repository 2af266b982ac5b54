"""A Transformer step's input as it travels to the other ranks: its host fields in a JSON header, its index tensors
(token ids, positions, block tables, the rows to score; all int64) joined into one payload that one broadcast
carries, read on the device where they are (no copy to the host: on CUDA the host may run a step ahead)."""

from __future__ import annotations

import torch

from quill.models.batch import StepBatch


def pack(batch: StepBatch) -> tuple[dict, torch.Tensor]:
    """(header fields, payload) of `batch`, for `unpack` on another rank."""
    tables, scored = batch.block_tables, batch.logits_indices
    parts = [batch.token_ids, batch.positions, tables.reshape(-1)]
    if scored is not None:
        parts.append(scored)
    fields = {"query_lens": list(batch.query_lens), "tables": list(tables.shape),
              "scored": None if scored is None else int(scored.shape[0])}
    return fields, torch.cat([p.to(torch.long) for p in parts])


def unpack(fields: dict, payload: torch.Tensor) -> StepBatch:
    """The StepBatch `pack` was given, its tensors views of `payload`."""
    num_tokens = sum(fields["query_lens"])
    rows, width = fields["tables"]
    sizes = [num_tokens, num_tokens, rows * width] + ([fields["scored"]] if fields["scored"] is not None else [])
    token_ids, positions, tables, *scored = payload.split(sizes)
    return StepBatch(token_ids=token_ids, positions=positions, query_lens=fields["query_lens"],
                     block_tables=tables.view(rows, width), logits_indices=scored[0] if scored else None)
