"""Keys for prefix caching: one per full block of tokens, chained through all earlier blocks.

The key of block i stands for tokens[0 : (i + 1) * block_size]. Keys are
(hash of the previous key, tokens of this block): the block's own tokens are
compared exactly by the dict, so a hash collision alone never matches.
"""

from __future__ import annotations

BlockKey = tuple[int, tuple[int, ...]]


def block_keys(token_ids: list[int], block_size: int, num_blocks: int | None = None, start: int = 0,
               parent: int = 0) -> list[BlockKey]:
    """Keys of the first `num_blocks` full blocks (all full blocks when None), skipping the first `start`
    blocks, whose last key hashes to `parent` (so a growing sequence keys only its new blocks)."""
    full = len(token_ids) // block_size
    count = full if num_blocks is None else min(num_blocks, full)
    keys = []
    for i in range(start, count):
        key = (parent, tuple(token_ids[i * block_size : (i + 1) * block_size]))
        keys.append(key)
        parent = hash(key)
    return keys
