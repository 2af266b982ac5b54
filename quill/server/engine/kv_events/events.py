"""The records of a KV-cache event batch, encoded as vLLM encodes them: msgpack arrays, fields in order, an event's
first element its type's name, optional trailing fields left out when unset.

Arrays, not maps: vLLM sent arrays until mid-2026 and sends maps since (its PR #42892); llm-d's decoder read only
arrays before then and reads both after, so arrays are what every version of it reads. Block hashes are vLLM's
default external form, an unsigned 64-bit integer (`external_hash`).
"""

from __future__ import annotations

import msgspec

MEDIUM_GPU = "GPU"  # vLLM's name for the engine's own K,V cache, whatever the device (llm-d's "gpu" tier)


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Tagged by class name: an event encodes as [name, field, ...]."""


class BlockStored(KVCacheEvent):
    """Full blocks now cached, in order: each block's hash chains on the one before it, the first on
    `parent_block_hash` (None: the first block of a prompt); `token_ids` holds all their tokens."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # no adapters here: always None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float  # seconds since the epoch, when the batch was closed
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None  # vLLM's publisher always fills it in: 0 here


def external_hash(key: bytes) -> int:
    """A block key (a SHA-256 digest, prefix.py) as published: its last 8 bytes read big-endian, which is the low
    64 bits of the digest as vLLM's default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) sends its own."""
    return int.from_bytes(key[-8:], "big")
