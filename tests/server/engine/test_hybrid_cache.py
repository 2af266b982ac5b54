"""A model with a slot and K,V blocks per sequence: one manager over both, one table row holding both."""

from __future__ import annotations

import torch

from quill.models.state import HybridState, PagedKVCache, SlotState
from quill.server.engine.cache.cache_table import CacheTable
from quill.server.engine.cache.hybrid_cache import HybridCacheManager
from quill.server.engine.cache.kv_blocks import KVBlockManager
from quill.server.engine.cache.prefix import block_keys
from quill.server.engine.cache.state_kinds import KVBlocks, Slots, StateLayout
from quill.server.engine.cache.state_slots import StateSlotManager
from quill.server.sampling import SamplingParams
from tests.server.engine.helpers import record_hashed_blocks, run_to_completion, scripted_engine

BLOCK = 4


def manager(num_blocks=16, snapshots=2) -> HybridCacheManager:
    return HybridCacheManager(StateSlotManager(2 * (1 + snapshots), 2, BLOCK, aligned=True),
                              KVBlockManager(num_blocks, BLOCK))


def run_prompt(cache: HybridCacheManager, seq_id: int, tokens: list[int]) -> int:
    """Admit a sequence and commit its prompt chunk by chunk, as the scheduler does; returns the tokens found."""
    found = done = cache.admit(seq_id, tokens, len(tokens) - 1)
    while done < len(tokens):
        n = cache.chunk_limit(seq_id, done, len(tokens)) or len(tokens) - done
        assert cache.allocate(seq_id, done, n)
        done += n
        cache.commit(seq_id, tokens, done, len(tokens))
    return found


def test_a_row_holds_the_slot_then_the_blocks():
    cache = manager()
    table = CacheTable(2, 1 + 4, torch.device("cpu"))
    run_prompt(cache, 1, list(range(10)))
    table.apply(cache.table_edits.take())
    row = table.ids[table.row_of[1]].tolist()
    assert row[0] == cache.slots.slot(1) and row[1:4] == cache.kv.block_table(1)
    cache.free(1)
    table.apply(cache.table_edits.take())
    assert 1 not in table.row_of


def test_ops_say_which_state_they_change():
    cache = manager()
    run_prompt(cache, 1, list(range(10)))
    cache.fork(1, 2)
    assert cache.allocate(2, 10, 1)  # the child writes into the shared last block: copy-on-write
    parts = {(op.kind, op.part) for op in cache.take_ops()}
    assert parts == {("reset", "slots"), ("copy", "slots"), ("copy", "kv")}


def test_a_prefix_is_reused_only_where_both_kinds_hold_it():
    cache = manager()
    prompt = list(range(13))
    assert run_prompt(cache, 1, prompt[:9]) == 0  # saved at 8, its last block boundary
    cache.free(1)
    assert run_prompt(cache, 2, prompt) == 8  # saved at 12
    cache.free(2)
    assert run_prompt(cache, 3, prompt + [99]) == 12
    cache.free(3)
    # Lose the K,V of the third block: the snapshot after it is of no use, the one before it is.
    key = block_keys(prompt, BLOCK)[2]
    cache.kv.block_key[cache.kv.cached.pop(key)] = None
    assert cache.kv.cached_prefix(prompt, 13) == 8
    assert run_prompt(cache, 4, prompt + [98]) == 8
    assert cache.prefix_hits == 8 + 12 + 8 and cache.prefix_queries == 9 + 13 + 14 + 14


def test_a_prompt_pauses_only_at_its_last_block_boundary():
    cache = manager()
    cache.admit(1, list(range(30)), 29)
    assert cache.chunk_limit(1, 0, 30) == 28 and cache.chunk_limit(1, 5, 30) == 23
    assert cache.chunk_limit(1, 28, 30) is None


def test_prompts_that_part_after_a_shared_prefix_save_a_state_where_they_part():
    cache = manager()
    system = list(range(100, 110))  # two whole blocks and two tokens
    run_prompt(cache, 1, system + [1, 2, 3, 4, 5, 6, 7])  # saved at 16, its last block boundary
    cache.free(1)
    # The next prompt shares two blocks with it, and no state was saved there: its prefill pauses at 8 to save one.
    assert run_prompt(cache, 2, system + [9] * 7) == 0 and cache.slots.stop_at == {2: 8}
    cache.free(2)
    assert run_prompt(cache, 3, system + [8] * 7) == 8  # every later prompt resumes there


def test_a_prompts_blocks_are_hashed_once_for_both_kinds(monkeypatch):
    hashed = record_hashed_blocks(monkeypatch)
    cache = manager()
    prompt = list(range(1, 23))  # five whole blocks
    run_prompt(cache, 1, prompt)
    assert len(hashed) == len(set(hashed)) == 5
    hashed.clear()
    cache.free(1)
    assert run_prompt(cache, 2, prompt + [99]) == 20 and len(hashed) == 5  # a hit hashes the prompt once too


def test_layout_allocates_both_and_locates_each_sequences_share():
    from quill.models.families.scripted import ScriptedConfig, ScriptedModel
    from quill.models.batch import StepBatch

    model = ScriptedModel(ScriptedConfig(50, state_kind="hybrid"))
    layout = StateLayout(model, [KVBlocks(10, BLOCK, True), Slots(3, 3, BLOCK, True)], spare=1, max_model_len=16)
    assert isinstance(layout.state, HybridState)
    assert isinstance(layout.state.kv, PagedKVCache) and layout.state.kv.num_blocks == 11
    assert isinstance(layout.state.slots, SlotState) and layout.state.slots.num_slots == 7
    assert layout.width == 1 + 4 and layout.padding() == [6, 10, 10, 10, 10]
    assert layout.columns(5) == 1 + 2
    step = StepBatch(token_ids=torch.zeros(2, dtype=torch.long), positions=torch.zeros(2, dtype=torch.long),
                     query_lens=[1, 1])
    layout.locate(step, torch.tensor([[3, 7, 8], [5, 1, 2]]))
    assert step.slots.tolist() == [3, 5] and step.block_tables.tolist() == [[7, 8], [1, 2]]


def test_engine_serves_a_hybrid_model_like_the_others(tiny_tokenizer):
    requests = [("a", list(range(1, 12)), SamplingParams(max_tokens=8, temperature=0.0)),
                ("b", list(range(1, 12)) + [40], SamplingParams(max_tokens=6, n=3, temperature=0.8, seed=2)),
                ("c", [7, 8, 9], SamplingParams(max_tokens=5, use_beam_search=True, beam_width=3)),
                ("d", list(range(1, 12)), SamplingParams(max_tokens=8, temperature=0.0))]
    results = {}
    for kind in ("paged_kv", "hybrid"):
        engine = scripted_engine(tiny_tokenizer, state_kind=kind)
        engine.add_request(*requests[0])
        results[kind] = run_to_completion(engine)  # first, so that the others can reuse its prompt
        for request_id, prompt, params in requests[1:]:
            engine.add_request(request_id, prompt, params)
        results[kind].update(run_to_completion(engine))
        if kind == "hybrid":
            assert engine.cache.prefix_hits >= 8  # "b" and "d" resume from "a"'s snapshots
            assert engine.cache.kv.usage == 0 and engine.cache.slots.usage == 0
    assert results["hybrid"] == results["paged_kv"]


def test_a_hybrids_blocks_take_the_cache_bytes_its_slots_leave():
    """plan_state: every sequence a slot, snapshots_per_seq snapshots each, and K,V blocks in what --cache-bytes
    leaves beside those slots (and the graphs' spare one): the two kinds never share more than the budget."""
    from quill.models.families.scripted import ScriptedConfig, ScriptedModel
    from quill.models.state import state_parts
    from quill.server.engine.core import CacheConfig
    from quill.server.engine.scheduler import SchedulerConfig
    from quill.server.engine.cache.state_kinds import plan_state

    model = ScriptedModel(ScriptedConfig(50, state_kind="hybrid"))
    budget = 2**20
    layout = plan_state(model, CacheConfig(block_size=BLOCK, cache_bytes=budget, snapshots_per_seq=2),
                        SchedulerConfig(max_num_seqs=4), max_model_len=64, spare=1)
    kv, slots = state_parts(layout.state)
    assert slots.num_slots == 4 + 4 * 2 + 1
    slot_bytes = slots.bytes_per_slot * slots.num_slots
    assert kv.num_blocks == (budget - slot_bytes) // kv.bytes_per_block + 1
    assert layout.num_bytes - kv.bytes_per_block <= budget  # all but the spare block within the budget
    assert f"{(kv.num_blocks - 1) * BLOCK} tokens of K,V" in layout.describe()  # what sequences can use
