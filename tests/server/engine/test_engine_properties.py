"""Hypothesis drives the real engine with random arrivals, aborts and steps: budgets hold, nothing leaks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import QueueFullError, SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.server.engine.test_engine import loaded_model

BUDGET, MAX_SEQS = 12, 6

arrive = st.tuples(st.just("arrive"), st.integers(1, 20), st.sampled_from(["greedy", "n2", "n3", "beam2", "beam3"]),
                   st.integers(1, 8))
operations = st.lists(st.one_of(arrive, st.tuples(st.just("abort"), st.integers(0, 50)), st.just(("step",))),
                      min_size=1, max_size=40)

PARAMS = {
    "greedy": lambda m: SamplingParams(max_tokens=m, temperature=0),
    "n2": lambda m: SamplingParams(max_tokens=m, n=2, seed=1),
    "n3": lambda m: SamplingParams(max_tokens=m, n=3),
    "beam2": lambda m: SamplingParams(max_tokens=m, use_beam_search=True, beam_width=2),
    "beam3": lambda m: SamplingParams(max_tokens=m, use_beam_search=True, beam_width=3, n=2),
}


def check_cache(engine: EngineCore) -> None:
    cache = engine.cache
    live = [s for g in engine.scheduler.running for s in g.seqs]
    if hasattr(cache, "tables"):  # paged K,V: every block is free or referenced exactly as often as it is held
        held: dict[int, int] = {}
        for seq in live:
            for block in cache.block_table(seq.seq_id):
                held[block] = held.get(block, 0) + 1
        assert set(cache.tables) == {s.seq_id for s in live}
        assert all(cache.ref_counts[b] == n for b, n in held.items())
        assert len(held) + cache.num_free_blocks == cache.num_blocks
    else:  # state slots: one per live sequence, the rest free
        assert set(cache.slots) == {s.seq_id for s in live}
        assert len(set(cache.slots.values())) == len(live)
        assert len(live) + cache.num_free_slots == cache.num_seq_slots


@pytest.mark.parametrize("key", ["lstm", "gcnn", "transformer-llama"])
@given(ops=operations)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_traffic_keeps_budgets_and_frees_everything(key, tiny_tokenizer, ops):
    engine = EngineCore(loaded_model(key, tiny_tokenizer), EngineConfig(
        SchedulerConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=BUDGET, max_queue=20),
        CacheConfig(block_size=4, num_blocks=24),
    ))
    ids = []
    for op in ops:
        if op[0] == "arrive":
            _, length, kind, max_tokens = op
            request_id = f"r{len(ids)}"
            try:
                engine.add_request(request_id, list(range(1, length + 1)), PARAMS[kind](max_tokens))
                ids.append(request_id)
            except QueueFullError:
                pass
        elif op[0] == "abort" and ids:
            engine.abort(ids[op[1] % len(ids)])
        else:
            engine.step()
            assert engine.last_step.num_tokens <= BUDGET
            assert sum(len(g.seqs) for g in engine.scheduler.running) <= MAX_SEQS
            check_cache(engine)
    for _ in range(200):  # whatever is left runs to the end
        if not engine.has_work():
            break
        engine.step()
        check_cache(engine)
    assert not engine.has_work() and engine.cache.usage == 0
