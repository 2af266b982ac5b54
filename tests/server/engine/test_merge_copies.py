"""A run of block copies applied at once equals the copies applied one by one."""

from __future__ import annotations

import random

import torch

from quill.models.state import PagedKVCache
from quill.server.engine.cache.manager import CacheOp
from quill.server.engine.cache.state_kinds import _merge_copies


def _apply(ops, cache):
    for op in ops:
        if op.part == "kv":
            cache.copy_blocks(list(op.src), list(op.dst))


def test_merged_copies_do_what_the_copies_do():
    rng = random.Random(0)
    for _ in range(200):
        ops = [CacheOp("copy", (rng.randrange(8),), (rng.randrange(8),), "kv") for _ in range(rng.randrange(1, 6))]
        ops = [op for op in ops if op.src != op.dst]
        one, merged = (PagedKVCache(1, 8, 2, 1, 3, torch.float32, "cpu") for _ in range(2))
        torch.manual_seed(1)
        for cache in (one, merged):
            cache.k.copy_(torch.arange(cache.k.numel(), dtype=torch.float32).view_as(cache.k))
            cache.v.copy_(-cache.k)
        _apply(ops, one)
        _apply(_merge_copies(ops), merged)
        assert torch.equal(one.k, merged.k) and torch.equal(one.v, merged.v), ops


def test_independent_copies_become_one():
    ops = [CacheOp("copy", (1,), (5,), "kv"), CacheOp("copy", (2,), (6,), "kv"), CacheOp("copy", (5,), (7,), "kv"),
           CacheOp("reset", (), (0,), "slots"), CacheOp("copy", (3,), (4,), "kv")]
    assert _merge_copies(ops) == [CacheOp("copy", (1, 2), (5, 6), "kv"), CacheOp("copy", (5,), (7,), "kv"),
                                  ops[3], ops[4]]
