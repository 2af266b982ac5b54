"""Changes to where sequences' cache lives, recorded by a cache manager for the runner's table.

The runner keeps a row per live sequence on the device (cache_table.py): its block ids (paged K,V) or
its one state slot. Instead of re-reading every sequence's table each step, it learns what changed: the
cache manager records an edit where it changes a table (a sequence admitted with its prefix-cache blocks
or given its slot, blocks appended, a block replaced by its copy on write, a fork's inherited table, a
sequence freed), and the scheduler hands the edits since the last step to the runner with the batch.
Applied in order, they leave the runner's rows equal to the manager's tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TableEdit:
    """Columns [start, start + len(ids)) of the sequence's row now hold `ids`; `ids` None: the sequence left."""

    seq_id: int
    start: int = 0
    ids: tuple[int, ...] | None = None

    @property
    def is_free(self) -> bool:
        return self.ids is None


class TableEdits:
    """A cache manager's edits since the scheduler last took them, oldest first. `first_column`: where the
    manager's columns begin in a row shared with another manager's (a hybrid model's slot, then its blocks)."""

    def __init__(self, edits: list[TableEdit] | None = None, first_column: int = 0):
        self.edits: list[TableEdit] = [] if edits is None else edits
        self.first_column = first_column

    def shifted(self, first_column: int) -> "TableEdits":
        """Edits of another manager into the same list, in the columns from `first_column` on."""
        return TableEdits(self.edits, first_column)

    def write(self, seq_id: int, start: int, ids: Iterable[int]) -> None:
        self.edits.append(TableEdit(seq_id, self.first_column + start, tuple(ids)))

    def free(self, seq_id: int) -> None:
        self.edits.append(TableEdit(seq_id))

    def free_all(self, seq_ids: Iterable[int]) -> None:
        """Every one of these sequences left (the manager forgets them all at once)."""
        self.edits += [TableEdit(seq_id) for seq_id in seq_ids]

    def take(self) -> list[TableEdit]:
        edits = list(self.edits)
        self.edits.clear()  # in place: a shifted view shares the list
        return edits
