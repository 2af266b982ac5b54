"""Encoder outputs, one per distinct source, in blocks of the encoder cache (quill/models/state.py `EncoderCache`).

A request of an encoder-decoder model holds an entry from admission until it finishes or is preempted; every one of
its sequences (beams, samples) reads the entry's blocks, listed in the first columns of its row of the runner's
table: the source's length, then its blocks. Forks copy those columns, never the blocks. Entries are keyed by their
source tokens: a request whose source was encoded before (one document translated into ten languages) takes the
same entry, encoded once. An entry no request holds stays cached, least recently released first out, until its
blocks are needed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .table_edits import TableEdits


@dataclass(eq=False)
class EncoderEntry:
    source: tuple[int, ...]
    blocks: list[int]
    holders: int = 0  # requests holding it
    encoded: bool = False  # its blocks hold the encoder's output (or will, after the step it was scheduled in)
    sequences: set[int] = field(default_factory=set)  # sequences whose table rows point at it

    @property
    def length(self) -> int:
        return len(self.source)


class EncoderCacheManager:
    def __init__(self, num_blocks: int, block_size: int, width: int, extra_rows: int = 0):
        """`width`: blocks of the longest source the model takes (its table columns are 1 + width); `extra_rows`:
        rows an entry holds past its source's (an LSTM encoder's final state, which starts its decoder)."""
        self.num_blocks, self.block_size, self.width = num_blocks, block_size, width
        self.extra_rows = extra_rows
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.entries: dict[tuple[int, ...], EncoderEntry] = {}
        self.idle: OrderedDict[tuple[int, ...], EncoderEntry] = OrderedDict()  # held by none, oldest first
        self.entry_of: dict[int, EncoderEntry] = {}  # sequence id -> its request's entry
        self.table_edits = TableEdits()
        self.queries = self.hits = 0  # sources asked for, and found encoded
        self.held = 0  # blocks of entries some request holds (read by metrics every step: counted, not summed)

    @property
    def usage(self) -> float:
        return self.held / self.num_blocks if self.num_blocks else 0.0

    def blocks_for(self, length: int) -> int:
        return -(-(length + self.extra_rows) // self.block_size)

    def fits(self, length: int) -> bool:
        """Whether a source of `length` tokens can ever be held."""
        return self.blocks_for(length) <= min(self.width, self.num_blocks)

    def acquire(self, source: list[int]) -> EncoderEntry | None:
        """The entry of `source`, now held once more: cached, or new with blocks (encoded=False: to encode). None
        when no room is left even after dropping every idle entry."""
        key = tuple(source)
        self.queries += 1
        entry = self.entries.get(key)
        if entry is not None:
            self.hits += entry.encoded
            self.idle.pop(key, None)
            if entry.holders == 0:
                self.held += len(entry.blocks)
            entry.holders += 1
            return entry
        need = self.blocks_for(len(key))
        while len(self.free_blocks) < need and self.idle:
            _, oldest = self.idle.popitem(last=False)
            self._drop(oldest)
        if len(self.free_blocks) < need:
            return None
        entry = EncoderEntry(key, [self.free_blocks.pop() for _ in range(need)], holders=1)
        self.entries[key] = entry
        self.held += need
        return entry

    def release(self, entry: EncoderEntry) -> None:
        """A request lets its entry go; an encoded entry nobody holds stays for reuse, an unencoded one goes."""
        if self.entries.get(entry.source) is not entry:
            return  # forgotten by a reset since it was acquired
        entry.holders -= 1
        if entry.holders > 0:
            return
        self.held -= len(entry.blocks)
        if entry.encoded:
            self.idle[entry.source] = entry
        else:
            self._drop(entry)

    def bind(self, seq_id: int, entry: EncoderEntry) -> None:
        """The sequence reads `entry`: its table row's first columns say where."""
        self.entry_of[seq_id] = entry
        entry.sequences.add(seq_id)
        self.table_edits.write(seq_id, 0, [entry.length, *entry.blocks])

    def fork(self, parent_id: int, child_id: int) -> None:
        entry = self.entry_of.get(parent_id)
        if entry is not None:
            self.bind(child_id, entry)

    def unbind(self, seq_id: int) -> None:
        entry = self.entry_of.pop(seq_id, None)
        if entry is not None:
            entry.sequences.discard(seq_id)

    def reset(self) -> None:
        """Forget every entry (after a failed step: what it encoded may not be there)."""
        self.free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self.entries.clear()
        self.idle.clear()
        self.held = 0
        self.entry_of.clear()

    def _drop(self, entry: EncoderEntry) -> None:
        del self.entries[entry.source]
        self.free_blocks += entry.blocks
