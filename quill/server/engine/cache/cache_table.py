"""Where every live sequence's cache lives, kept on the device between steps: one row per sequence.

A row holds the sequence's block ids (paged K,V), or its state slot in a table of one column (LSTM,
gated CNN, state-space models), or both: the slot, then the blocks (hybrids, state_kinds.py). The runner
changes a row only where the cache manager changed that sequence's table (table_edits.py): a step
applies its few edits with one host-to-device copy, then gathers its sequences' rows on the device, in
the step's order. Re-packing every table from Python lists instead took half the host time of a decode
step of 256 sequences with 2,048-token contexts (33,000 block ids; 3.05 ms a step against 1.50 ms,
benchmarks/host_overhead.py on a 2-core AMD EPYC), growing with context length; the edits of a decode
step are the sequences crossing into a new block (about one in block_size) and nothing else.

A row's columns past its sequence's own blocks keep whatever ids an earlier occupant left there: valid
blocks, and harmless (the Triton kernel reads a sequence's keys up to its length only; SDPA masks them).
The last row is the padding row: every entry the scratch block or slot, for CUDA graphs' padding.
"""

from __future__ import annotations

import torch

from quill.models.host_copy import to_device

from .table_edits import TableEdit


class CacheTable:
    def __init__(self, num_rows: int, width: int, device: torch.device):
        """`num_rows`: the most sequences live at once; `width`: blocks of the longest sequence (1: slots)."""
        self.width = width
        self.ids = torch.zeros(num_rows + 1, width, dtype=torch.long, device=device)  # (rows + padding, width)
        self.padding_row = num_rows
        self.row_of: dict[int, int] = {}  # seq id -> its row
        self.free_rows = list(range(num_rows - 1, -1, -1))

    def apply(self, edits: list[TableEdit]) -> None:
        """Take in the cache manager's edits, in order: the host's bookkeeping first, then one device write."""
        changed: dict[tuple[int, int], int] = {}  # (row, column) -> id; a later edit of an entry wins
        row_of = self.row_of
        for edit in edits:
            if edit.is_free:
                row = row_of.pop(edit.seq_id, None)  # None: its step never reached the runner (it failed)
                if row is not None:
                    self.free_rows.append(row)
                continue
            row = row_of.get(edit.seq_id)
            if row is None:
                if not self.free_rows:  # the scheduler caps live sequences: this is a bookkeeping bug
                    raise RuntimeError("no free row in the cache table")
                row = row_of[edit.seq_id] = self.free_rows.pop()
            end = edit.start + len(edit.ids)
            if end > self.width:
                raise ValueError(f"sequence {edit.seq_id} needs {end} blocks; the table holds {self.width}")
            for column, block in enumerate(edit.ids, edit.start):
                changed[row, column] = block
        if changed:  # entries of the flattened table, then their ids: one copy
            width = self.width
            flat = to_device([row * width + column for row, column in changed] + list(changed.values()),
                             self.ids.device, torch.long)
            self.ids.view(-1).index_copy_(0, flat[: len(changed)], flat[len(changed):])

    def gather(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """(len(rows), width): the first `width` columns of `rows` (on the device), in their order."""
        return self.ids[:, :width].index_select(0, rows)

    def fill_padding(self, scratch: list[int]) -> None:
        """Point the padding row at `scratch` (an id per column), blocks or slots no sequence is ever given."""
        self.ids[self.padding_row] = torch.tensor(scratch, dtype=torch.long)
