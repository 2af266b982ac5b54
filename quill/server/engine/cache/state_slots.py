"""Fixed-size state bookkeeping (LSTM h,c; gated-CNN windows; state-space and xLSTM states): a slot per live sequence.

The tensors live in the model's `SlotState`; this class decides which slot is whose and records the resets and
copies it needs as `CacheOp`s, applied by the runner, and each sequence's slot as a `TableEdit` for the runner's
table of slots.

Prefix caching: a fixed-size state is the whole past of a sequence, so it can be saved after any token, not only
at block boundaries. It is copied into a spare slot (a snapshot) where a prompt's prefill chunk ends, where the
prompt ends, and where a sequence finishes (its prompt and output but the last token, which it never read): the
next turn of a conversation, whose prompt extends the last one, resumes there. Where prompts share a prefix and then
part (one system prompt, many questions), a state is saved where they part: the block keys of recent prompts are
remembered, and a prompt whose leading blocks were seen before, further than any snapshot reaches, computes them
as a chunk of their own and is snapshotted at their end, for the prompts after it. A snapshot is keyed by the exact
tokens before it: the SHA-256 chain of its full `interval`-token blocks (prefix.py) and the tokens after the last of
them. A new prompt resumes from its longest snapshotted prefix. Snapshots are evicted least recently used first when
their slots are needed: the spare slots are the memory budget.

`aligned` (a hybrid model, whose K,V blocks are reusable only whole): snapshots are taken at block boundaries only,
where a chunk ends on one, and a prompt's prefill stops at the last boundary before its end (and where prompts
part) so that there is one. A snapshot is keyed when its copy is queued, and taken back if the step that
carries the copy fails (unfinished_keys.py).
"""

from __future__ import annotations

from collections import OrderedDict

from .manager import CacheOp
from .prefix import ROOT, BlockKey, block_keys
from .table_edits import TableEdits
from .unfinished_keys import UnfinishedKeys

SnapshotKey = tuple[BlockKey, tuple[int, ...]]  # (key of the full blocks before it, the tokens after them)
MAX_SEEN_BLOCKS = 1 << 16  # block keys of recent prompts remembered (about 6 MiB)


class StateSlotManager:
    def __init__(self, num_slots: int, num_seq_slots: int, interval: int, enable_prefix_caching: bool = True,
                 aligned: bool = False):
        if num_slots < num_seq_slots:
            raise ValueError("the state holds fewer slots than sequences asked for")
        self.ops: list[CacheOp] = []
        self.table_edits = TableEdits()
        self.interval = interval
        self.enable_prefix_caching = enable_prefix_caching
        self.aligned = aligned
        self.num_seq_slots = num_seq_slots
        self.free_slots = list(range(num_seq_slots - 1, -1, -1))
        self.free_snapshot_slots = list(range(num_slots - 1, num_seq_slots - 1, -1))
        self.snapshots: OrderedDict[SnapshotKey, int] = OrderedDict()  # least recently used first
        self.tails: dict[BlockKey, set[tuple[int, ...]]] = {}  # the snapshots' keys, by their full blocks
        self.slots: dict[int, int] = {}
        self.keys: dict[int, list[BlockKey]] = {}  # seq -> the keys of its leading full blocks, as far as known
        self.seen: OrderedDict[BlockKey, None] = OrderedDict()  # block keys of recent prompts, least recent first
        self.stop_at: dict[int, int] = {}  # seq -> where its prefill pauses to save a state that later prompts share
        self.unfinished = UnfinishedKeys()
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots)

    @property
    def num_snapshots(self) -> int:
        return len(self.snapshots)

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
            slot = self._drop(key)
            if slot is not None:
                self.free_snapshot_slots.append(slot)
        self.slots.clear()
        self.keys.clear()
        self.stop_at.clear()
        self.free_slots = list(range(self.num_seq_slots - 1, -1, -1))
        self.ops.clear()

    def step_finished(self) -> None:
        self.unfinished.finished()

    def take_ops(self) -> list[CacheOp]:
        self.unfinished.launched()
        ops, self.ops = self.ops, []
        return ops

    # ---- sequences ---------------------------------------------------------------

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int, reach: int | None = None,
              keys: list[BlockKey] | None = None) -> int:
        """Give a sequence a slot, started from the longest snapshotted prefix of at most `max_cached_tokens` tokens
        (`reach` instead: a hybrid's tokens whose K,V blocks are still cached, fewer). `keys`: the keys of the
        prompt's leading full blocks within `max_cached_tokens`, if known. Returns tokens already computed."""
        slot = self._take_slot()
        self.slots[seq_id] = slot
        self.table_edits.write(seq_id, 0, (slot,))
        found, snapshot = 0, None
        if self.enable_prefix_caching:
            self.prefix_queries += len(token_ids)
            if keys is None:
                keys = block_keys(token_ids, self.interval, max_cached_tokens // self.interval)
            self.keys[seq_id] = keys
            limit = max_cached_tokens if reach is None else reach
            hit = self._longest_snapshot(token_ids, limit, keys)
            if hit is not None:
                found, key = hit
                snapshot = self.snapshots[key]
                self.snapshots.move_to_end(key)
            self.prefix_hits += found
            shared = self._remember(keys) * self.interval
            if shared > found:
                self.stop_at[seq_id] = shared
        if snapshot is None:
            self.ops.append(CacheOp("reset", (), (slot,), "slots"))
        else:
            self.ops.append(CacheOp("copy", (snapshot,), (slot,), "slots"))
        return found

    def chunk_limit(self, seq_id: int, num_computed: int, num_prompt_tokens: int) -> int | None:
        """Where the sequence's next prefill chunk must stop for a state to be saved there: the end of a prefix
        earlier prompts share (aligned: or the prompt's last block boundary)."""
        if not self.enable_prefix_caching or num_computed >= num_prompt_tokens - 1:
            return None
        points = [self.stop_at.get(seq_id, 0)]
        if self.aligned:
            points.append((num_prompt_tokens - 1) // self.interval * self.interval)
        ahead = [point for point in points if num_computed < point < num_prompt_tokens]
        return min(ahead) - num_computed if ahead else None

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        return seq_id in self.slots  # the state is fixed-size: nothing grows

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        """After a step: snapshot the state where a prefill chunk or the prompt ended (aligned: at a boundary)."""
        if not self.enable_prefix_caching or num_computed > num_prompt_tokens:
            return
        if self.aligned and num_computed % self.interval:
            return
        self._snapshot(seq_id, token_ids, num_computed)

    def retire(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        """The sequence finished, its state holding `token_ids[:num_computed]`: keep it for a prompt that goes on
        from there (the next turn of a chat), then free the slot."""
        if self.enable_prefix_caching and not self.aligned and num_computed > 0 and seq_id in self.slots:
            self._snapshot(seq_id, token_ids, num_computed)
        self.free(seq_id)

    def fork(self, parent_id: int, child_id: int) -> None:
        slot = self._take_slot()
        self.ops.append(CacheOp("copy", (self.slots[parent_id],), (slot,), "slots"))
        self.slots[child_id] = slot
        self.table_edits.write(child_id, 0, (slot,))
        if parent_id in self.keys:
            self.keys[child_id] = list(self.keys[parent_id])  # they part from here on

    def free(self, seq_id: int) -> None:
        self.keys.pop(seq_id, None)
        self.stop_at.pop(seq_id, None)
        slot = self.slots.pop(seq_id, None)
        if slot is not None:
            self.free_slots.append(slot)
            self.table_edits.free(seq_id)

    # ---- snapshots -----------------------------------------------------------------

    def _remember(self, keys: list[BlockKey]) -> int:
        """Note a prompt's block keys; returns how many of its leading blocks an earlier prompt had."""
        shared = 0
        while shared < len(keys) and keys[shared] in self.seen:
            shared += 1
        for key in keys:
            self.seen[key] = None
            self.seen.move_to_end(key)
        while len(self.seen) > MAX_SEEN_BLOCKS:
            self.seen.popitem(last=False)
        return shared

    def _longest_snapshot(self, token_ids: list[int], max_cached_tokens: int,
                          keys: list[BlockKey]) -> tuple[int, SnapshotKey] | None:
        """(tokens, key) of the longest snapshotted prefix of at most `max_cached_tokens` tokens, given the keys of
        the prompt's full blocks (at least up to there). Every block boundary is looked at, longest first: a shorter
        snapshot may be gone while a longer one stays."""
        size = self.interval
        keys = [ROOT, *keys]
        for blocks in range(min(len(keys) - 1, max_cached_tokens // size), -1, -1):
            tails = self.tails.get(keys[blocks])
            if not tails:
                continue
            start = blocks * size
            room = max_cached_tokens - start
            best = None
            for tail in tails:
                if len(tail) <= room and (best is None or len(tail) > len(best)) \
                        and tuple(token_ids[start : start + len(tail)]) == tail:
                    best = tail
            if best is not None:
                return start + len(best), (keys[blocks], best)
        return None

    def _key(self, seq_id: int, token_ids: list[int], num_tokens: int) -> SnapshotKey:
        """The key of the sequence's first `num_tokens` tokens; only blocks not keyed before are hashed."""
        full = num_tokens // self.interval
        keys = self.keys.setdefault(seq_id, [])
        if full > len(keys):
            keys += block_keys(token_ids[: full * self.interval], self.interval, start=len(keys),
                               parent=keys[-1] if keys else ROOT)
        return (keys[full - 1] if full else ROOT), tuple(token_ids[full * self.interval : num_tokens])

    def _snapshot(self, seq_id: int, token_ids: list[int], num_tokens: int) -> None:
        key = self._key(seq_id, token_ids, num_tokens)
        if key in self.snapshots:
            self.snapshots.move_to_end(key)
            return
        if self.free_snapshot_slots:
            target = self.free_snapshot_slots.pop()
        elif self.snapshots:
            target = self._drop(next(iter(self.snapshots)))  # the least recently used
        else:
            return
        self.ops.append(CacheOp("copy", (self.slots[seq_id],), (target,), "slots"))
        self.snapshots[key] = target
        self.tails.setdefault(key[0], set()).add(key[1])
        self.unfinished.add(key, self.unfinished.num_launched + 1)  # the next step carries the copy

    def _drop(self, key: SnapshotKey) -> int | None:
        """Forget a snapshot; its slot, or None if there was none."""
        slot = self.snapshots.pop(key, None)
        if slot is not None:
            tails = self.tails[key[0]]
            tails.discard(key[1])
            if not tails:
                del self.tails[key[0]]
        return slot
