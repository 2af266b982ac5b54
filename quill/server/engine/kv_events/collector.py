"""What the K,V block manager reports about its prefix cache, gathered into one batch per engine step.

The manager reports each change where it makes it: a full block's key entering the cache (stored), a key leaving it
when its block is reused (removed), the keys a reset takes back after a failed step (removed too). So replaying
every batch in order rebuilds exactly the keys the cache holds. The engine closes a batch after every step
(`flush`), whether it succeeded or not: a failed step's batch holds what it stored before it failed, then what the
reset took back of that, and nothing is left out. AllBlocksCleared opens the stream (the cache starts empty: an
indexer drops what it kept of this server's previous run) and closes it (the cache is gone with the engine).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec

from .config import KVEventsConfig
from .events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, external_hash

log = logging.getLogger("quill.engine")


class KVEventCollector:
    def __init__(self, block_size: int, publish: Callable[[bytes], None], close: Callable[[], None] = lambda: None):
        """`publish`: takes one encoded batch; `close`: stops publishing."""
        self.block_size = block_size
        self._publish, self._close = publish, close
        self._encode = msgspec.msgpack.Encoder().encode
        self.pending: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        self.cleared()
        self.flush()

    def stored(self, keys: list[bytes], indices: list[int], token_ids: list[int]) -> None:
        """The blocks `indices` (ascending) of a sequence whose leading blocks' keys are `keys` now hold their keys;
        one event per run of consecutive blocks, whose parent is the key of the block before the run."""
        size = self.block_size
        start = 0
        for i in range(1, len(indices) + 1):
            if i < len(indices) and indices[i] == indices[i - 1] + 1:
                continue
            first, last = indices[start], indices[i - 1]
            self.pending.append(BlockStored(
                [external_hash(key) for key in keys[first : last + 1]],
                external_hash(keys[first - 1]) if first else None,
                token_ids[first * size : (last + 1) * size], size, None, MEDIUM_GPU, None))
            start = i

    def removed(self, key: bytes) -> None:
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockRemoved):  # evictions in a row: one event
            last.block_hashes.append(external_hash(key))
        else:
            self.pending.append(BlockRemoved([external_hash(key)], MEDIUM_GPU))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def flush(self) -> None:
        """Publish what was reported since the last flush as one batch (none if nothing was)."""
        if self.pending:
            batch, self.pending = KVEventBatch(time.time(), self.pending, 0), []
            self._publish(self._encode(batch))

    def close(self) -> None:
        """The engine stops, its cache with it."""
        self.cleared()
        self.flush()
        self._close()


def open_kv_events(config: KVEventsConfig | None, layout, name: str) -> KVEventCollector | None:
    """Publish the events of `layout`'s prefix-cached K,V blocks (state_kinds.py), if `config` asks for events and
    the model has such blocks; the block manager then reports to the collector returned."""
    if config is None:
        return None
    manager = next((kind.manager for kind in layout.kinds if kind.part == "kv"), None)
    if manager is None or not manager.enable_prefix_caching:
        log.info("%s: publishes no KV-cache events: it keeps no prefix-cached K,V blocks", name)
        return None
    from .publisher import ZmqEventPublisher  # pyzmq is loaded only by a server that publishes

    publisher = ZmqEventPublisher(config)
    log.info("%s: publishing KV-cache events on %s%s, topic %r", name, config.endpoint,
             f" (replay on {config.replay_endpoint})" if config.replay_endpoint else "", config.topic)
    manager.events = KVEventCollector(manager.block_size, publisher.publish, publisher.close)
    return manager.events
