"""Prefix-cache keys: a prefix's key stands for all of its tokens, so no two prefixes share cached work."""

from __future__ import annotations

import hashlib
import struct

from quill.server.engine.cache.kv_blocks import KVBlockManager
from quill.server.engine.cache.prefix import ROOT, block_keys
from quill.server.engine.cache.state_slots import StateSlotManager

# Two blocks of 4 token ids whose chained Python hashes collide: hash((0, A)) == hash((0, B)), as the old
# keys (parent hash, tokens) chained them. Found in 20 s by a distinguished-point collision search over
# v -> hash((0, four 16-bit chunks of v)) (about 2**33 hashes in C); CPython's tuple hash is the same on
# every run, so anyone can search one offline.
A = [9471, 32808, 53802, 22773]
B = [62993, 55781, 19122, 44636]
SHARED = [5, 6, 7, 8]


def test_the_blocks_collide_under_the_old_chained_hash():
    assert A != B and hash((0, tuple(A))) == hash((0, tuple(B)))


def test_prefixes_whose_old_chained_hashes_collide_get_different_keys():
    assert block_keys(A + SHARED, 4)[1] != block_keys(B + SHARED, 4)[1]


def test_a_key_is_the_sha256_of_its_parent_and_its_packed_tokens():
    first, second = block_keys(A + SHARED + [1], 4)
    assert first == hashlib.sha256(ROOT + struct.pack("<4I", *A)).digest()
    assert second == hashlib.sha256(first + struct.pack("<4I", *SHARED)).digest()


def test_a_growing_sequence_keys_only_its_new_blocks():
    tokens = list(range(100, 120))
    keys = block_keys(tokens, 4)
    assert len(keys) == 5 and len(set(keys)) == 5
    assert block_keys(tokens, 4, start=2, parent=keys[1]) == keys[2:]
    assert block_keys(tokens, 4, num_blocks=3, start=1, parent=keys[0]) == keys[1:3]


def test_blocks_cached_after_a_colliding_prefix_are_not_reused():
    m = KVBlockManager(16, 4)
    for seq_id, prompt in [(1, B + [9, 9, 9, 9, 1]), (2, A + SHARED + [1])]:  # B's block, then the collider
        m.admit(seq_id, prompt, len(prompt) - 1)
        m.allocate(seq_id, 0, len(prompt))
        m.commit(seq_id, prompt, len(prompt), len(prompt))
        m.free(seq_id)
    assert m.admit(3, B + SHARED + [1], 8) == 4  # B's own block only: A's second block came after another prefix


def test_a_snapshot_after_a_colliding_prefix_is_not_reused():
    m = StateSlotManager(4, 2, 4)
    prompt = A + SHARED + [1]
    m.admit(1, prompt, 8)
    for num_computed in (4, 8):
        m.commit(1, prompt, num_computed, len(prompt))
    m.free(1)
    assert m.admit(2, B + SHARED + [1], 8) == 0
    assert len(m.snapshots) == 2  # both of A's snapshots were taken
