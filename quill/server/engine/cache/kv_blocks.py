"""Paged K,V cache bookkeeping: which block holds which tokens of which sequence.

Plain Python on the CPU; the tensors live in the model's `PagedKVCache`: a copy-on-write
is recorded as a `CacheOp` that the runner applies before the next forward pass, and every change to a
sequence's table as a `TableEdit` for the runner's copy of the tables. Blocks are shared by
reference count between forked sequences and between sequences whose prompts share
a prefix (prefix caching: a full block is keyed by all the tokens up to its end).
A freed block keeps its key until it is reused, so a later request can still hit it, and so does a block
of a failed step's requests if a finished step wrote it (unfinished_keys.py). Every key that enters or leaves the
cache is told to `events` when KV-cache events are published (kv_events/).
"""

from __future__ import annotations

from collections import OrderedDict

from .manager import CacheOp
from .prefix import ROOT, BlockKey, block_keys
from .table_edits import TableEdits
from .unfinished_keys import UnfinishedKeys


class KVBlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ops: list[CacheOp] = []
        self.table_edits = TableEdits()
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_key: list[BlockKey | None] = [None] * num_blocks
        self.cached: dict[BlockKey, int] = {}  # key -> block holding exactly those tokens
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest freed first
        self.tables: dict[int, list[int]] = {}
        self.keys: dict[int, list[BlockKey]] = {}  # seq -> the keys of its leading full blocks, as far as hashed
        self.keyed: dict[int, int] = {}  # seq -> how many of its leading blocks hold their key in the cache
        self.unfinished = UnfinishedKeys()
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # prompt tokens found cached
        self.events = None  # a KVEventCollector (kv_events/) when KV-cache events are published

    # ---- what the scheduler asks -------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, seq_id: int) -> list[int]:
        return self.tables[seq_id]

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int,
              keys: list[BlockKey] | None = None) -> int:
        """Start a sequence; reuse cached blocks of its prefix. `keys`: the keys of the prompt's leading full blocks
        (at least those within `max_cached_tokens`) if known, kept and extended as the sequence's blocks fill (a
        hybrid's slot manager holds the same list). Returns how many tokens are already computed."""
        table: list[int] = []
        if self.enable_prefix_caching:
            self.prefix_queries += len(token_ids)
            keys = self.keys[seq_id] = self._prompt_keys(token_ids, max_cached_tokens) if keys is None else keys
            table = self._cached_blocks(keys, max_cached_tokens)
            for block in table:
                self._take(block)
            self.keyed[seq_id] = len(table)
            self.prefix_hits += len(table) * self.block_size
        self.tables[seq_id] = table
        self.table_edits.write(seq_id, 0, table)
        return len(table) * self.block_size

    def _prompt_keys(self, token_ids: list[int], max_cached_tokens: int) -> list[BlockKey]:
        return block_keys(token_ids, self.block_size, max_cached_tokens // self.block_size)

    def _cached_blocks(self, keys: list[BlockKey], max_cached_tokens: int) -> list[int]:
        """The blocks of the longest cached run of the leading full blocks of `keys`, within `max_cached_tokens`."""
        blocks = []
        for key in keys[: max_cached_tokens // self.block_size]:
            block = self.cached.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cached_prefix(self, token_ids: list[int], max_cached_tokens: int, keys: list[BlockKey] | None = None) -> int:
        """How many leading tokens `admit` would find cached now, changing nothing (`keys`: as admit's)."""
        if not self.enable_prefix_caching:
            return 0
        keys = self._prompt_keys(token_ids, max_cached_tokens) if keys is None else keys
        return len(self._cached_blocks(keys, max_cached_tokens)) * self.block_size

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        """Make room to write tokens [num_computed, num_computed + num_new_tokens). False (and no change) if full."""
        table = self.tables[seq_id]
        first_block = num_computed // self.block_size
        if num_new_tokens == 1 and first_block < len(table) and self.ref_counts[table[first_block]] == 1:
            return True  # the common decode step: one token into a block this sequence owns alone
        shared = [i for i in range(first_block, len(table)) if self.ref_counts[table[i]] > 1]
        grow = max(0, self.blocks_needed(num_computed + num_new_tokens) - len(table))
        if grow + len(shared) > self.num_free_blocks:
            return False
        for i in shared:  # copy-on-write: never write into a block another sequence reads
            fresh = self._pop_free()
            self.ops.append(CacheOp("copy", (table[i],), (fresh,), "kv"))
            self._release(table[i])
            table[i] = fresh
            self.table_edits.write(seq_id, i, (fresh,))
        if grow:
            table.extend(self._pop_free() for _ in range(grow))
            self.table_edits.write(seq_id, len(table) - grow, table[-grow:])
        return True

    def can_admit(self, num_seqs: int = 1) -> bool:
        return True  # blocks are checked when they are allocated

    def chunk_limit(self, seq_id: int, num_computed: int, num_prompt_tokens: int) -> int | None:
        return None  # any chunk size: every full block is keyed as it is written

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        """Tokens [0, num_computed) are now in the cache, written by the latest launched step at the latest: key
        their full blocks (prompt or output) for reuse."""
        full = num_computed // self.block_size
        done = self.keyed.get(seq_id, 0)
        if not self.enable_prefix_caching or full <= done:
            return
        table, keys = self.tables[seq_id], self.keys.setdefault(seq_id, [])
        if full > len(keys):  # only blocks never hashed before
            keys += block_keys(token_ids[: full * self.block_size], self.block_size, start=len(keys),
                               parent=keys[-1] if keys else ROOT)
        stored = []
        for i, (block, key) in enumerate(zip(table[done:full], keys[done:full]), done):
            # A block already keyed keeps its key; tokens already cached in another block keep that one.
            if self.block_key[block] is None and key not in self.cached:
                self.block_key[block] = key
                self.cached[key] = block
                self.unfinished.add(key, self.unfinished.num_launched)
                stored.append(i)
        self.keyed[seq_id] = full
        if self.events is not None and stored:
            self.events.stored(keys, stored, token_ids)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent until one of them writes."""
        table = list(self.tables[parent_id])
        for block in table:
            self.ref_counts[block] += 1
        self.tables[child_id] = table
        self.table_edits.write(child_id, 0, table)
        if parent_id in self.keys:
            self.keys[child_id] = list(self.keys[parent_id])  # they part from here on
            self.keyed[child_id] = self.keyed[parent_id]

    def free(self, seq_id: int) -> None:
        if seq_id in self.tables:  # a request aborted while it waited holds none
            self.table_edits.free(seq_id)
        self.keys.pop(seq_id, None)
        self.keyed.pop(seq_id, None)
        for block in reversed(self.tables.pop(seq_id, [])):  # tail first: evicted before the shared prefix
            self._release(block)

    def retire(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        self.free(seq_id)  # its full blocks were keyed as they filled; they stay cached once free

    def reset(self) -> None:
        """Forget every sequence, and every key whose block no finished step wrote (after a failed step, when no
        request holds blocks). The step may have died halfway through its bookkeeping, so the pool is rebuilt:
        every block is free, those still keyed last (they stay cached until reused)."""
        self.table_edits.free_all(self.tables)
        for key in self.unfinished.take_back():
            block = self.cached.pop(key, None)
            if block is not None:
                self.block_key[block] = None
                if self.events is not None:
                    self.events.removed(key)
        self.ref_counts = [0] * self.num_blocks
        unkeyed = [block for block, key in enumerate(self.block_key) if key is None]
        self.free_blocks = OrderedDict.fromkeys([*unkeyed, *self.free_blocks, *range(self.num_blocks)])
        self.tables.clear()
        self.keys.clear()
        self.keyed.clear()
        self.ops.clear()

    def step_finished(self) -> None:
        self.unfinished.finished()

    def take_ops(self) -> list[CacheOp]:
        self.unfinished.launched()
        ops, self.ops = self.ops, []
        return ops

    # ---- block pool --------------------------------------------------------------

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free_blocks[block]
        self.ref_counts[block] += 1

    def _pop_free(self) -> int:
        block, _ = self.free_blocks.popitem(last=False)
        key = self.block_key[block]
        if key is not None:  # evict the old contents from the prefix cache
            del self.cached[key]
            self.block_key[block] = None
            if self.events is not None:
                self.events.removed(key)
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks[block] = None
