"""What the scheduler needs from a cache manager, and the device work a manager asks for.

Two managers implement `CacheManager`: `KVBlockManager` (paged K,V blocks) and
`StateSlotManager` (fixed-size state slots: LSTM, gated CNN, state-space models); `HybridCacheManager`
joins one of each for a model that holds both (state_kinds.py). Both are plain Python: when
their bookkeeping needs tensors to change (copy-on-write of a block, a forked or snapshotted
slot, a slot reset to the empty state) they append a `CacheOp` to their pending list, and the
runner applies the list, in order, before the next forward pass. Changes to a sequence's block table
or slot are recorded the same way, as `TableEdits` for the runner's device-side table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from .table_edits import TableEdits


@dataclass(frozen=True, slots=True)
class CacheOp:
    kind: Literal["copy", "reset"]  # copy: dst gets src's contents; reset: dst gets the empty state
    src: tuple[int, ...]
    dst: tuple[int, ...]
    part: Literal["kv", "slots"]  # which kind of state: K,V blocks or state slots (a hybrid model holds both)


class CacheManager(Protocol):
    usage: float  # fraction of the cache held by live sequences
    prefix_queries: int  # prompt tokens looked up in the prefix cache
    prefix_hits: int  # prompt tokens found there
    table_edits: TableEdits  # changes to sequences' block tables or slots, for the runner

    def can_admit(self, num_seqs: int) -> bool:
        """Whether `num_seqs` more sequences can start now."""

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int) -> int:
        """Start a sequence; returns how many of its leading tokens are already computed."""

    def chunk_limit(self, seq_id: int, num_computed: int, num_prompt_tokens: int) -> int | None:
        """The most prompt tokens the next chunk may compute (None: any number)."""

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        """Room for tokens [num_computed, num_computed + num_new_tokens); False, changing nothing, if full."""

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        """Tokens [0, num_computed) are now in the cache."""

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child continues from the parent's cached state."""

    def free(self, seq_id: int) -> None: ...

    def retire(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        """Free a finished sequence, whose cache holds `token_ids[:num_computed]`, keeping what may serve a prompt
        that goes on from there."""

    def reset(self) -> None:
        """Forget every sequence, and every prefix key no finished step wrote (after a failed step)."""

    def take_ops(self) -> list[CacheOp]:
        """The device work asked for since the last call, in order: called once for each step launched."""

    def step_finished(self) -> None:
        """The results of the oldest launched step not yet finished were read: what it wrote may be kept."""
