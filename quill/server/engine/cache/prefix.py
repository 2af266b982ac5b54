"""Keys for prefix caching: one per full block of tokens, chained through all earlier blocks.

The key of block i stands for tokens[0 : (i + 1) * block_size]: it is the SHA-256 digest of the key of
block i - 1 followed by this block's token ids, packed as 4-byte little-endian integers. Two different
prefixes get the same key only through a SHA-256 collision, which nobody can find, so a cache may
match on the key alone.

Why not Python's `hash()` of (parent hash, tokens), as before: its 64 bits chain every earlier block,
and the integer-tuple hash is the same on every run, so a collision is an offline search of about 2**33
hashes (under a minute on one core; tests/server/engine/test_prefix.py holds one). With one, a prompt starts from blocks or
state computed for another prefix. SHA-256 rather than a keyed BLAKE2b: a 256-bit digest needs no secret
to resist collisions, keys stay the same from run to run, and with the CPU's SHA instructions OpenSSL's
SHA-256 is the cheaper of the two here (`python -m benchmarks.prefix_keys`).
"""

from __future__ import annotations

import hashlib
import struct

BlockKey = bytes  # 32-byte SHA-256 digest
ROOT: BlockKey = bytes(32)  # the parent of the first block


def block_keys(token_ids: list[int], block_size: int, num_blocks: int | None = None, start: int = 0,
               parent: BlockKey = ROOT) -> list[BlockKey]:
    """Keys of the first `num_blocks` full blocks (all full blocks when None), skipping the first `start`
    blocks, whose last key is `parent` (so a growing sequence keys only its new blocks)."""
    full = len(token_ids) // block_size
    count = full if num_blocks is None else min(num_blocks, full)
    pack = struct.Struct(f"<{block_size}I").pack  # fixed width: no two token lists pack alike
    sha256 = hashlib.sha256
    keys = []
    for i in range(start, count):
        parent = sha256(parent + pack(*token_ids[i * block_size : (i + 1) * block_size])).digest()
        keys.append(parent)
    return keys
