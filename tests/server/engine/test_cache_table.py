"""The runner's device-side table of block ids or slots: each row changes exactly where its edits say."""

from __future__ import annotations

import pytest
import torch

from quill.server.engine.cache.cache_table import CacheTable
from quill.server.engine.cache.table_edits import TableEdit


def rows_of(table: CacheTable, lengths: dict[int, int]) -> dict[int, list[int]]:
    """seq id -> the first `lengths[seq id]` entries of its row, read back from the device."""
    return {seq_id: table.ids[table.row_of[seq_id], :n].tolist() for seq_id, n in lengths.items()}


def test_new_rows_appended_blocks_and_copies_on_write_change_only_their_entries():
    table = CacheTable(num_rows=4, width=6, device=torch.device("cpu"))
    table.apply([TableEdit(1, 0, (7, 8)), TableEdit(2, 0, (7, 9, 10))])  # 2 shares block 7 (a cached prefix)
    assert rows_of(table, {1: 2, 2: 3}) == {1: [7, 8], 2: [7, 9, 10]}
    before = table.ids.clone()
    table.apply([TableEdit(1, 2, (11,)), TableEdit(2, 2, (12,))])  # 1 grows a block; 2's block 10 copied on write
    assert rows_of(table, {1: 3, 2: 3}) == {1: [7, 8, 11], 2: [7, 9, 12]}
    changed = (table.ids != before).nonzero().tolist()
    assert changed == sorted([[table.row_of[1], 2], [table.row_of[2], 2]])  # nothing else was written


def test_a_freed_row_serves_the_next_sequence_with_its_own_ids():
    table = CacheTable(num_rows=2, width=3, device=torch.device("cpu"))
    table.apply([TableEdit(1, 0, (4,)), TableEdit(2, 0, (5,))])  # state slots 4 and 5: a table of one column
    row = table.row_of[1]
    table.apply([TableEdit(1), TableEdit(3, 0, (6,))])  # 1 finished; 3 takes its row, with another slot
    assert table.row_of == {2: table.row_of[2], 3: row} and table.ids[row, 0] == 6
    # Freed and reused within one batch of edits (a failed admission, then another): the last write wins.
    table.apply([TableEdit(3), TableEdit(4, 0, (1, 2, 3)), TableEdit(4), TableEdit(5, 0, (9,))])
    assert table.row_of[5] == row and table.ids[row, 0] == 9


def test_freeing_a_sequence_it_never_saw_is_harmless():
    table = CacheTable(num_rows=1, width=2, device=torch.device("cpu"))
    table.apply([TableEdit(8)])  # e.g. its step failed before reaching the runner
    table.apply([TableEdit(9, 0, (3,))])
    assert table.row_of == {9: 0}


def test_too_many_sequences_or_blocks_are_refused():
    table = CacheTable(num_rows=1, width=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="needs 3 blocks"):
        table.apply([TableEdit(1, 0, (1, 2, 3))])
    table = CacheTable(num_rows=1, width=2, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="no free row"):
        table.apply([TableEdit(1, 0, (1,)), TableEdit(2, 0, (2,))])


def test_rows_gathered_in_the_steps_order_and_padding_rows_point_at_scratch():
    table = CacheTable(num_rows=3, width=4, device=torch.device("cpu"))
    table.apply([TableEdit(1, 0, (1, 2)), TableEdit(2, 0, (3,)), TableEdit(3, 0, (4, 5, 6))])
    table.fill_padding([99, 99, 98, 98])
    order = [table.row_of[3], table.row_of[1], table.padding_row]
    assert table.gather(torch.tensor(order), 2).tolist() == [[4, 5], [1, 2], [99, 99]]
