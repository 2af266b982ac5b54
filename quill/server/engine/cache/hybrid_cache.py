"""One cache manager over a model's state of two kinds: a slot per sequence and K,V blocks (LFM2, and hybrids of
its kind: convolution or state-space layers beside attention layers).

Every request goes to both managers. A sequence's row of the runner's table holds its slot in column 0 and its
blocks after it (the block manager writes its edits shifted by one column). A prefix is reused only where both
kinds have it: the longest slot snapshot whose tokens' K,V blocks are all still cached. Snapshots are taken at
block boundaries (the slot manager's interval is the block size), so a snapshot's prefix is whole blocks.
"""

from __future__ import annotations

from .manager import CacheOp
from .kv_blocks import KVBlockManager
from .prefix import block_keys
from .state_slots import StateSlotManager


class HybridCacheManager:
    def __init__(self, slots: StateSlotManager, kv: KVBlockManager):
        if slots.interval != kv.block_size:
            raise ValueError("a hybrid model's slot snapshots must fall on block boundaries")
        self.slots, self.kv = slots, kv
        self.table_edits = slots.table_edits
        kv.table_edits = self.table_edits.shifted(1)

    @property
    def prefix_queries(self) -> int:
        return self.kv.prefix_queries  # every prompt is admitted to both managers: the block manager counts it

    @property
    def prefix_hits(self) -> int:
        return self.kv.prefix_hits

    @property
    def usage(self) -> float:
        return max(self.slots.usage, self.kv.usage)

    def can_admit(self, num_seqs: int = 1) -> bool:
        return self.slots.can_admit(num_seqs)

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int) -> int:
        # The longest snapshot whose tokens' K,V are all cached; the slot manager still sees the whole prompt, to
        # remember its blocks and pause where it parts from earlier prompts. Its blocks are hashed once, for both.
        size = self.kv.block_size
        keys = block_keys(token_ids, size, max_cached_tokens // size) if self.kv.enable_prefix_caching else None
        reach = self.kv.cached_prefix(token_ids, max_cached_tokens, keys)
        found = self.slots.admit(seq_id, token_ids, max_cached_tokens, reach=reach, keys=keys)
        # snapshots sit on block boundaries: exactly `found` tokens' blocks
        self.kv.admit(seq_id, token_ids, found, keys)
        return found

    def chunk_limit(self, seq_id: int, num_computed: int, num_prompt_tokens: int) -> int | None:
        return self.slots.chunk_limit(seq_id, num_computed, num_prompt_tokens)

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        return self.kv.allocate(seq_id, num_computed, num_new_tokens) and self.slots.allocate(
            seq_id, num_computed, num_new_tokens)

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        self.slots.commit(seq_id, token_ids, num_computed, num_prompt_tokens)
        self.kv.commit(seq_id, token_ids, num_computed, num_prompt_tokens)

    def fork(self, parent_id: int, child_id: int) -> None:
        self.slots.fork(parent_id, child_id)
        self.kv.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        self.slots.free(seq_id)
        self.kv.free(seq_id)

    def retire(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        self.free(seq_id)  # snapshots are taken at block boundaries only, as its prompt is computed

    def reset(self) -> None:
        self.slots.reset()
        self.kv.reset()

    def take_ops(self) -> list[CacheOp]:
        return self.slots.take_ops() + self.kv.take_ops()

    def step_finished(self) -> None:
        self.slots.step_finished()
        self.kv.step_finished()
