"""Fixed-size state bookkeeping (LSTM h,c; gated-CNN windows): one slot per live sequence.

The tensors live in the model's `SlotState`; this class decides which slot is whose
and records the resets and copies it needs as `CacheOp`s, applied by the runner, and each sequence's slot
as a `TableEdit` for the runner's table of slots. Prefix caching for recurrent and
convolutional models: the state after every `interval` prompt tokens is snapshotted
into a spare slot, keyed by all the tokens before it; a later prompt with the same
prefix starts from the snapshot instead of from zero. Snapshots are evicted oldest
first when their slots are needed. A snapshot is keyed when its copy is queued, and taken back if the
step that carries the copy fails (unfinished_keys.py).
"""

from __future__ import annotations

from collections import OrderedDict

from .cache import CacheOp
from .prefix import ROOT, BlockKey, block_keys
from .table_edits import TableEdits
from .unfinished_keys import UnfinishedKeys


class StateSlotManager:
    def __init__(self, num_slots: int, num_seq_slots: int, interval: int, enable_prefix_caching: bool = True):
        if num_slots < num_seq_slots:
            raise ValueError("the state holds fewer slots than sequences asked for")
        self.ops: list[CacheOp] = []
        self.table_edits = TableEdits()
        self.interval = interval
        self.enable_prefix_caching = enable_prefix_caching
        self.num_seq_slots = num_seq_slots
        self.free_slots = list(range(num_seq_slots - 1, -1, -1))
        self.free_snapshot_slots = list(range(num_slots - 1, num_seq_slots - 1, -1))
        self.snapshots: OrderedDict[BlockKey, int] = OrderedDict()  # least recently used first
        self.slots: dict[int, int] = {}
        self.keyed: dict[int, tuple[int, BlockKey]] = {}  # seq -> (its prompt intervals already keyed, the last key)
        self.unfinished = UnfinishedKeys()
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_slots) / self.num_seq_slots

    def slot(self, seq_id: int) -> int:
        return self.slots[seq_id]

    def can_admit(self, num_seqs: int = 1) -> bool:
        return len(self.free_slots) >= num_seqs

    def _take_slot(self) -> int:
        if not self.free_slots:  # the scheduler reserves seats, so this is a bookkeeping bug, not load
            raise RuntimeError("no free state slot")
        return self.free_slots.pop()

    def reset(self) -> None:
        """Forget every sequence, and every snapshot whose copy no finished step made (after a failed step, when
        no request holds state any more): its pending copy is dropped here, or ran in a step that failed."""
        self.table_edits.free_all(self.slots)
        for key in self.unfinished.take_back():
            slot = self.snapshots.pop(key, None)
            if slot is not None:
                self.free_snapshot_slots.append(slot)
        self.slots.clear()
        self.keyed.clear()
        self.free_slots = list(range(self.num_seq_slots - 1, -1, -1))
        self.ops.clear()

    def step_finished(self) -> None:
        self.unfinished.finished()

    def take_ops(self) -> list[CacheOp]:
        self.unfinished.launched()
        ops, self.ops = self.ops, []
        return ops

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int) -> int:
        """Give a sequence a slot, started from the longest snapshotted prefix. Returns tokens already computed."""
        slot = self._take_slot()
        self.slots[seq_id] = slot
        self.table_edits.write(seq_id, 0, (slot,))
        found, snapshot = 0, None
        if self.enable_prefix_caching:
            self.prefix_queries += len(token_ids)
            hit = self._longest_snapshot(token_ids, max_cached_tokens)
            if hit is not None:
                count, key = hit
                found, snapshot = count * self.interval, self.snapshots[key]
                self.snapshots.move_to_end(key)
                self.keyed[seq_id] = (count, key)
            self.prefix_hits += found
        if snapshot is None:
            self.ops.append(CacheOp("reset", (), (slot,)))
        else:
            self.ops.append(CacheOp("copy", (snapshot,), (slot,)))
        return found

    def _longest_snapshot(self, token_ids: list[int], max_cached_tokens: int) -> tuple[int, BlockKey] | None:
        """(intervals, key) of the longest snapshotted prefix of at most `max_cached_tokens` tokens, or None. Every
        boundary is looked up: a shorter snapshot may have been evicted while a longer one stays."""
        hit = None
        for i, key in enumerate(block_keys(token_ids, self.interval, max_cached_tokens // self.interval)):
            if key in self.snapshots:
                hit = (i + 1, key)
        return hit

    def cached_prefix(self, token_ids: list[int], max_cached_tokens: int) -> int:
        """How many leading tokens `admit` would resume from now, changing nothing."""
        if not self.enable_prefix_caching:
            return 0
        hit = self._longest_snapshot(token_ids, max_cached_tokens)
        return 0 if hit is None else hit[0] * self.interval

    def chunk_limit(self, num_computed: int, num_prompt_tokens: int) -> int | None:
        """Prefill chunks stop at snapshot points, so each boundary's state exists to be saved."""
        if not self.enable_prefix_caching or num_computed >= num_prompt_tokens - 1:
            return None
        next_point = (num_computed // self.interval + 1) * self.interval
        return next_point - num_computed if next_point < num_prompt_tokens else None

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        return seq_id in self.slots  # the state is fixed-size: nothing grows

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        """After a step: snapshot the state if it now sits exactly on a prompt boundary."""
        if not self.enable_prefix_caching or num_computed % self.interval or num_computed >= num_prompt_tokens:
            return
        full = num_computed // self.interval
        done, parent = self.keyed.get(seq_id, (0, ROOT))
        if done >= full:  # chunks stop at every snapshot point, so the chain only grows; if not, start over
            done, parent = 0, ROOT
        key = block_keys(token_ids[: full * self.interval], self.interval, start=done, parent=parent)[-1]
        self.keyed[seq_id] = (full, key)
        if key in self.snapshots:
            self.snapshots.move_to_end(key)
            return
        if self.free_snapshot_slots:
            target = self.free_snapshot_slots.pop()
        elif self.snapshots:
            _, target = self.snapshots.popitem(last=False)
        else:
            return
        self.ops.append(CacheOp("copy", (self.slots[seq_id],), (target,)))
        self.snapshots[key] = target
        self.unfinished.add(key, self.unfinished.num_launched + 1)  # the next step carries the copy

    def fork(self, parent_id: int, child_id: int) -> None:
        slot = self._take_slot()
        self.ops.append(CacheOp("copy", (self.slots[parent_id],), (slot,)))
        self.slots[child_id] = slot
        self.table_edits.write(child_id, 0, (slot,))
        if parent_id in self.keyed:
            self.keyed[child_id] = self.keyed[parent_id]

    def free(self, seq_id: int) -> None:
        self.keyed.pop(seq_id, None)
        slot = self.slots.pop(seq_id, None)
        if slot is not None:
            self.free_slots.append(slot)
            self.table_edits.free(seq_id)
