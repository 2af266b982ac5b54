"""The scheduler on fabricated requests: budgets, admission, chunking, preemption, no leaks."""

from __future__ import annotations

import random

import pytest

from quill.server.engine.cache.kv_blocks import KVBlockManager
from quill.server.engine.scheduler import QueueFullError, Scheduler, SchedulerConfig
from quill.server.engine.sequence import Sequence, SequenceGroup
from quill.server.sampling.params import SamplingParams


def group(request_id: str, prompt_len: int, seq_id: int, n: int = 1) -> SequenceGroup:
    prompt = [seq_id * 1000 + i for i in range(prompt_len)]  # distinct: no accidental prefix hits
    g = SequenceGroup(request_id, prompt, SamplingParams(n=n))
    g.seqs.append(Sequence(seq_id, g, list(prompt), prompt_len))
    return g


def scheduler(num_blocks=64, block_size=4, **config):
    cache = KVBlockManager(num_blocks, block_size)
    return Scheduler(SchedulerConfig(**config), cache), cache


def finish_step(s: Scheduler, batch) -> None:
    """Pretend the model ran: commit, then give every fully computed sequence one new token."""
    s.commit(batch)
    for seq, _ in batch.work:
        if seq.num_uncomputed == 0:
            seq.token_ids.append(7)


def test_token_budget_and_chunked_prefill():
    s, _ = scheduler(max_num_batched_tokens=16)
    s.add(group("long", 40, 1))
    s.add(group("short", 3, 2))
    batch = s.schedule()
    assert [(seq.seq_id, n) for seq, n in batch.work] == [(1, 16)]  # the long prompt takes the whole budget
    finish_step(s, batch)
    batch = s.schedule()
    assert [(seq.seq_id, n) for seq, n in batch.work] == [(1, 16)]
    finish_step(s, batch)
    batch = s.schedule()  # last 8 tokens of the long prompt, and the short one joins
    assert [(seq.seq_id, n) for seq, n in batch.work] == [(1, 8), (2, 3)]
    finish_step(s, batch)
    batch = s.schedule()  # both decode one token
    assert [(seq.seq_id, n) for seq, n in batch.work] == [(1, 1), (2, 1)]


def test_decoding_sequences_are_not_stalled_by_a_long_prompt():
    s, _ = scheduler(max_num_batched_tokens=8)
    s.add(group("a", 2, 1))
    finish_step(s, s.schedule())
    s.add(group("long", 100, 2))
    for _ in range(5):
        batch = s.schedule()
        assert batch.work[0][0].seq_id == 1 and batch.work[0][1] == 1  # "a" decodes every step
        assert batch.num_tokens <= 8
        finish_step(s, batch)


def test_max_num_seqs_caps_the_running_set_counting_samples():
    s, _ = scheduler(max_num_seqs=4)
    s.add(group("a", 2, 1, n=3))
    s.add(group("b", 2, 2, n=2))
    s.schedule()
    assert [g.request_id for g in s.running] == ["a"]  # b would make 5 sequences
    assert [g.request_id for g in s.waiting] == ["b"]


def test_queue_is_bounded():
    s, _ = scheduler(max_queue=2)
    s.add(group("a", 2, 1))
    s.add(group("b", 2, 2))
    with pytest.raises(QueueFullError):
        s.add(group("c", 2, 3))


def test_full_cache_preempts_the_newest_request_and_it_resumes():
    s, cache = scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    s.add(group("old", 7, 1))  # 2 blocks
    s.add(group("new", 7, 2))  # 2 blocks: cache now full
    finish_step(s, s.schedule())
    finish_step(s, s.schedule())  # both at 8 tokens: the blocks are exactly full
    batch = s.schedule()  # both need a third block: "new" is evicted
    assert batch.num_preemptions == 1
    assert [seq.seq_id for seq, _ in batch.work] == [1]
    assert [g.request_id for g in s.waiting] == ["new"]
    new = s.waiting[0].seqs[0]
    assert new.num_computed == 0 and new.num_tokens == 9  # recomputed later, tokens kept
    finish_step(s, batch)
    s.remove(s.running[0])  # "old" finishes
    batch = s.schedule()
    # Its first block survived in the prefix cache (its tail block was reused by "old"): 5 tokens to recompute.
    assert [(seq.seq_id, n) for seq, n in batch.work] == [(2, 5)]


def test_request_too_large_for_the_whole_cache_fails_instead_of_looping():
    s, _ = scheduler(num_blocks=2, block_size=4)
    s.add(group("huge", 20, 1))
    batch = s.schedule()
    assert [g.request_id for g in batch.failed] == ["huge"]
    assert not s.has_work()


def test_random_arrivals_and_aborts_never_exceed_budgets_or_leak_blocks():
    rng = random.Random(0)
    s, cache = scheduler(num_blocks=24, block_size=4, max_num_seqs=5, max_num_batched_tokens=20, max_queue=50)
    next_id = 0
    for _ in range(300):
        if rng.random() < 0.4 and len(s.waiting) < 50:
            next_id += 1
            s.add(group(f"r{next_id}", rng.randint(1, 30), next_id))
        if rng.random() < 0.1 and s.running:
            s.remove(rng.choice(s.running))
        batch = s.schedule()
        assert batch.num_tokens <= 20
        assert s.num_running_seqs <= 5
        held = {b for g in s.running for seq in g.seqs for b in cache.block_table(seq.seq_id)}
        assert len(held) + cache.num_free_blocks == cache.num_blocks
        finish_step(s, batch)
        for g in list(s.running):
            if g.seqs[0].num_output_tokens >= 5:
                s.remove(g)
    for g in list(s.running) + list(s.waiting):
        s.remove(g)
    assert cache.num_free_blocks == cache.num_blocks


def test_sampling_slots_follow_the_running_set():
    s, _ = scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    s.add(group("old", 7, 1))
    s.add(group("new", 7, 2))
    batch = s.schedule()
    slots = {g.request_id: g.slot for g in batch.admitted}
    assert sorted(slots) == ["new", "old"] and len(set(slots.values())) == 2
    finish_step(s, batch)
    finish_step(s, s.schedule())
    batch = s.schedule()  # "new" is preempted: its slot goes back
    assert s.waiting[0].slot is None and batch.admitted == []
    assert len(s.free_slots) == 3
    s.remove(s.running[0])
    assert len(s.free_slots) == 4


def test_copy_on_write_travels_in_the_batch():
    s, _ = scheduler(num_blocks=8, block_size=4)
    g = group("a", 6, 1, n=2)
    s.add(g)
    finish_step(s, s.schedule())
    parent = g.seqs[0]
    child = Sequence(99, g, list(parent.token_ids), parent.num_prompt_tokens, index=1, num_computed=parent.num_computed)
    s.cache.fork(parent.seq_id, child.seq_id)
    g.seqs.append(child)
    g.is_forked = True
    child.token_ids[-1] = 8  # the two samples chose different first tokens
    batch = s.schedule()
    assert [(op.kind, op.src) for op in batch.cache_ops] == [("copy", (s.cache.block_table(99)[1],))] or \
        [(op.kind, op.dst) for op in batch.cache_ops] == [("copy", (s.cache.block_table(1)[1],))]
    assert len(batch.cache_ops) == 1  # one of the two writers copies the shared half-full block


def test_beams_reach_their_last_token_together():
    s, _ = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=8)
    warm = group("warm", 0, 3)
    warm.prompt_token_ids = warm.seqs[0].token_ids = [1, 2, 3, 4, 9]  # leaves block [1, 2, 3, 4] cached
    s.add(warm)
    finish_step(s, s.schedule())
    s.remove(warm)
    # A preempted beam search comes back: beam a finds 4 tokens cached, beam b none.
    g = SequenceGroup("beam", [1, 2, 3], SamplingParams(use_beam_search=True, beam_width=2, temperature=0.0))
    g.seqs += [Sequence(1, g, [1, 2, 3, 4, 5, 6], 3), Sequence(2, g, [1, 2, 3, 5, 5, 7], 3)]
    g.is_forked = True
    s.add(g)
    batch = s.schedule()  # a could finish (2 tokens) but b cannot (6 > its share of 4): a keeps its last one
    assert [(seq.seq_id, seq.num_computed, n) for seq, n in batch.work] == [(1, 4, 1), (2, 0, 4)]
    finish_step(s, batch)
    batch = s.schedule()
    assert [(seq.seq_id, n) for seq, n in batch.work] == [(1, 1), (2, 2)]  # both finish in this step


def test_device_work_asked_for_with_nothing_to_run_waits_for_the_next_step():
    from quill.server.engine.cache.state_slots import StateSlotManager

    cache = StateSlotManager(4, 2, 4)
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=4), cache)
    first = group("first", 10, 1)
    s.add(first)
    finish_step(s, s.schedule())  # [0, 4) computed: a snapshot copy is asked for
    s.remove(first)
    assert s.schedule().cache_ops == []  # nothing runs, so nothing would apply the copy
    s.add(group("second", 3, 2))
    ops = s.schedule().cache_ops
    assert [op.kind for op in ops] == ["copy", "reset"] and ops[0].src == (0,)

