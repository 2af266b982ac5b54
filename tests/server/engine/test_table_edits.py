"""The cache managers' table edits, replayed in order, give their tables; the scheduler hands them on."""

from __future__ import annotations

from quill.server.engine.cache.kv_blocks import KVBlockManager
from quill.server.engine.scheduler import Scheduler, SchedulerConfig
from quill.server.engine.sequence import Sequence, SequenceGroup
from quill.server.engine.cache.state_slots import StateSlotManager
from quill.server.engine.cache.table_edits import TableEdit
from quill.server.sampling import SamplingParams


def replay(edits: list[TableEdit], tables: dict[int, list[int]]) -> dict[int, list[int]]:
    """What the runner's rows hold after `edits`, as plain lists."""
    for edit in edits:
        if edit.is_free:
            tables.pop(edit.seq_id, None)
            continue
        row = tables.setdefault(edit.seq_id, [])
        assert edit.start <= len(row), "an edit past the end of a row would leave a hole"
        row[edit.start : edit.start + len(edit.ids)] = edit.ids
    return tables


def test_block_edits_follow_admission_prefix_hits_growth_forks_copies_and_frees():
    m = KVBlockManager(num_blocks=16, block_size=4)
    seen: dict[int, list[int]] = {}

    def in_step():
        assert replay(m.table_edits.take(), seen) == m.tables

    prompt = list(range(10))
    m.admit(1, prompt, 9)
    m.allocate(1, 0, 10)
    in_step()
    m.commit(1, prompt, 10, 10)
    assert m.admit(2, prompt[:8] + [50, 51], 9) == 8  # two blocks from the prefix cache at admission
    in_step()
    m.allocate(2, 8, 2)
    m.fork(1, 3)  # the child starts with the parent's table
    in_step()
    m.allocate(3, 10, 1)  # copy-on-write of the shared, half-full last block
    m.allocate(1, 10, 3)  # the parent owns that block alone now, and grows a block
    in_step()
    assert seen[3][2] != seen[1][2] and len(seen[1]) == 4
    m.free(2)
    m.admit(4, [60, 61], 1)
    m.allocate(4, 0, 2)
    in_step()
    m.reset()  # after a failed step: every sequence is gone
    in_step()
    assert seen == {}


def test_slot_edits_give_each_sequence_its_slot_and_free_it():
    m = StateSlotManager(num_slots=6, num_seq_slots=3, interval=4)
    seen: dict[int, list[int]] = {}

    def in_step():
        assert replay(m.table_edits.take(), seen) == {seq_id: [slot] for seq_id, slot in m.slots.items()}

    m.admit(1, [1, 2, 3], 2)
    m.admit(2, [4, 5], 1)
    m.fork(1, 3)
    in_step()
    m.free(1)
    m.admit(4, [6], 0)  # takes the slot 1 left
    in_step()
    assert seen[4] == [m.slot(4)]
    m.reset()
    in_step()
    assert seen == {}


def test_a_batch_with_no_work_leaves_its_edits_for_the_next():
    cache = KVBlockManager(num_blocks=8, block_size=4)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=8), cache)
    group = SequenceGroup("a", [1, 2, 3], SamplingParams(max_tokens=2))
    group.seqs.append(Sequence(0, group, [1, 2, 3], 3))
    scheduler.add(group)
    first = scheduler.schedule()
    assert [e.seq_id for e in first.table_edits] == [0, 0]  # admitted with no cached blocks, then one allocated
    scheduler.remove(group)  # aborted before its next step
    assert scheduler.schedule().table_edits == []  # nothing runs: the runner would never see the free
    later = SequenceGroup("b", [4], SamplingParams(max_tokens=1))
    later.seqs.append(Sequence(1, later, [4], 1))
    scheduler.add(later)
    assert [(e.seq_id, e.is_free) for e in scheduler.schedule().table_edits] == [(0, True), (1, False), (1, False)]
