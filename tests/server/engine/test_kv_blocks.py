"""Paged K,V bookkeeping: allocation, prefix caching, forks, copy-on-write, no leaks."""

from __future__ import annotations

from quill.server.engine.cache.kv_blocks import KVBlockManager
from tests.server.engine.helpers import record_hashed_blocks


class Copies:
    """The copy-on-write work a manager asked the runner for, so far."""

    def __init__(self, manager: KVBlockManager):
        self.manager = manager
        self.seen: list[tuple[int, int]] = []

    @property
    def done(self) -> list[tuple[int, int]]:
        for op in self.manager.take_ops():
            assert op.kind == "copy"
            self.seen += list(zip(op.src, op.dst))
        return self.seen


def manager(num_blocks=8, block_size=4, caching=True):
    m = KVBlockManager(num_blocks, block_size, caching)
    return m, Copies(m)


def test_memory_in_use_is_proportional_to_tokens_held():
    m, _ = manager()
    m.admit(1, list(range(10)), 9)
    assert m.allocate(1, 0, 10)
    assert len(m.block_table(1)) == 3 and m.num_free_blocks == 5
    assert m.allocate(1, 10, 1) and len(m.block_table(1)) == 3  # token 11 fits in block 3
    assert m.allocate(1, 11, 2) and len(m.block_table(1)) == 4
    m.free(1)
    assert m.num_free_blocks == 8 and m.usage == 0


def test_allocation_that_does_not_fit_changes_nothing():
    m, _ = manager(num_blocks=2)
    m.admit(1, list(range(12)), 11)
    assert not m.allocate(1, 0, 12)
    assert m.block_table(1) == [] and m.num_free_blocks == 2


def test_shared_prompt_prefix_reuses_full_blocks():
    m, _ = manager()
    prompt = list(range(10))
    m.admit(1, prompt, 9)
    m.allocate(1, 0, 10)
    m.commit(1, prompt, 10, 10)
    other = prompt[:8] + [99, 98, 97]
    cached = m.admit(2, other, len(other) - 1)
    assert cached == 8
    assert m.block_table(2) == m.block_table(1)[:2]
    assert m.prefix_hits == 8 and m.prefix_queries == 10 + 11


def test_identical_prompt_recomputes_at_least_its_last_token():
    m, _ = manager()
    prompt = list(range(8))
    m.admit(1, prompt, 7)
    m.allocate(1, 0, 8)
    m.commit(1, prompt, 8, 8)
    assert m.admit(2, prompt, 7) == 4  # block 2 would cover the last token: not taken


def test_freed_blocks_stay_reusable_until_evicted():
    m, _ = manager(num_blocks=4)
    prompt = list(range(8))
    m.admit(1, prompt, 7)
    m.allocate(1, 0, 8)
    m.commit(1, prompt, 8, 8)
    m.free(1)
    assert m.admit(2, prompt + [1], 8) == 8  # still cached after its owner left
    m.free(2)
    m.admit(3, [50 + i for i in range(16)], 15)  # needs every block: evicts the cached ones
    assert m.allocate(3, 0, 16)
    m.free(3)
    assert m.admit(4, prompt + [1], 8) == 0


def test_fork_shares_blocks_and_copies_on_write():
    m, copies = manager()
    prompt = list(range(6))  # one full block and a half-filled one
    m.admit(1, prompt, 5)
    m.allocate(1, 0, 6)
    m.fork(1, 2)
    assert m.block_table(2) == m.block_table(1)
    assert m.num_free_blocks == 6  # forking costs no memory
    assert m.allocate(2, 6, 1)  # child writes position 6: gets its own copy of the half block
    assert m.block_table(2)[0] == m.block_table(1)[0]
    assert m.block_table(2)[1] != m.block_table(1)[1]
    assert copies.done == [(m.block_table(1)[1], m.block_table(2)[1])]
    assert m.allocate(1, 6, 1)  # the parent now owns its block alone: no copy
    assert len(copies.done) == 1
    m.free(1)
    m.free(2)
    assert m.num_free_blocks == 8


def test_no_prefix_caching_means_no_hits():
    m, _ = manager(caching=False)
    prompt = list(range(8))
    m.admit(1, prompt, 7)
    m.allocate(1, 0, 8)
    m.commit(1, prompt, 8, 8)
    assert m.admit(2, prompt, 7) == 0 and m.prefix_queries == 0


def test_a_reset_takes_back_the_keys_no_finished_step_wrote_and_keeps_the_rest():
    m, _ = manager(num_blocks=8)
    first, second = list(range(9)), list(range(50, 59))
    m.admit(1, first, 8)
    m.allocate(1, 0, 9)
    m.take_ops()  # step 1 launched
    m.step_finished()
    m.commit(1, first, 9, 9)
    m.admit(2, second, 8)
    m.allocate(2, 0, 9)
    m.take_ops()  # step 2 launched; with overlapped scheduling it is committed before its results are read
    m.commit(2, second, 9, 9)
    m.reset()  # step 2 failed
    assert m.num_free_blocks == 8 and m.usage == 0
    assert m.admit(3, first, 8) == 8  # written by a finished step: still cached
    assert m.admit(4, second, 8) == 0  # its step never finished: maybe never written


def test_a_sequences_blocks_are_hashed_once_from_admission_to_its_last_token(monkeypatch):
    hashed = record_hashed_blocks(monkeypatch)
    m, _ = manager()
    tokens = list(range(1, 11))
    m.admit(1, tokens, 9)  # two full blocks within reach
    assert m.allocate(1, 0, 10)
    m.commit(1, tokens, 10, 10)
    for n in range(11, 14):  # decode into a third block
        tokens.append(n)
        assert m.allocate(1, n - 1, 1)
        m.commit(1, tokens, n, 10)
    assert len(hashed) == len(set(hashed)) == 3
