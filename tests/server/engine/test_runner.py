"""The runner without a real model: what it packs for the model, what it applies, what it hands back."""

from __future__ import annotations

import pytest
import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.models.families.scripted import ScriptedConfig, ScriptedModel
from quill.server.engine.cache.cache_table import CacheTable
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import TEST_DEVICE
from tests.server.engine.graph_emulation import EmulatedGraphs
from tests.server.engine.helpers import collect, run_to_completion, scripted_engine


class Recorder:
    """Wraps a model's step to keep every StepBatch it was given (as plain lists)."""

    def __init__(self, model):
        self.model, self.real_step, self.batches = model, model.step, []
        model.step = self

    def __call__(self, batch, state):
        self.batches.append({
            "token_ids": batch.token_ids.tolist(), "positions": batch.positions.tolist(),
            "query_lens": list(batch.query_lens), "logits_indices": batch.logits_indices.tolist(),
            "block_tables": None if batch.block_tables is None else batch.block_tables.tolist(),
            "slots": None if batch.slots is None else batch.slots.tolist(),
        })
        return self.real_step(batch, state)


def test_inputs_pack_prefill_chunks_decodes_and_scoring_rows(tiny_tokenizer):
    engine = scripted_engine(tiny_tokenizer, budget=8, block_size=4)
    rec = Recorder(engine.loaded.model)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("a", [5, 6, 7], greedy)
    engine.step()  # a's prompt in one go: one logits row, its last token
    first = rec.batches[0]
    assert first["token_ids"] == [5, 6, 7] and first["positions"] == [0, 1, 2]
    assert first["query_lens"] == [3] and first["logits_indices"] == [2]
    assert len(first["block_tables"]) == 1 and len(first["block_tables"][0]) == 1
    engine.add_request("b", list(range(10, 20)), SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1))
    engine.step()  # a decodes one token; b's prompt is chunked to what is left of the budget (7 tokens)
    second = rec.batches[1]
    assert second["query_lens"] == [1, 7]
    assert second["positions"] == [3] + list(range(7))
    assert second["token_ids"][1:] == list(range(10, 17))
    # a's next-token row, then every row of b's chunk (b scores its prompt); b's chunk is not its last
    assert second["logits_indices"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [len(t) for t in second["block_tables"]] == [2, 2]  # padded to the widest table of the step
    run_to_completion(engine)
    assert engine.cache.usage == 0


def test_slot_state_models_get_slots_and_reset_state(tiny_tokenizer):
    engine = scripted_engine(tiny_tokenizer, state_kind="slots")
    rec = Recorder(engine.loaded.model)
    engine.state["last"].fill_(5.0)  # stale state from an earlier sequence
    engine.add_request("a", [3, 4], SamplingParams(max_tokens=2, temperature=0.0))
    engine.step()
    slot = rec.batches[0]["slots"][0]
    assert rec.batches[0]["block_tables"] is None
    assert engine.state["last"][slot].item() == 0.0  # admission reset the slot before the forward pass


def test_copy_on_write_is_applied_before_the_forward_pass(tiny_tokenizer):
    engine = scripted_engine(tiny_tokenizer, block_size=4)
    engine.add_request("a", [1, 2, 3, 4, 5, 6], SamplingParams(n=2, max_tokens=3, temperature=1.0, seed=1))
    engine.step()  # prompt computed and forked: both samples share the half-full second block
    parent, child = engine.groups["a"].seqs
    shared = engine.cache.block_table(parent.seq_id)[1]
    assert engine.cache.block_table(child.seq_id)[1] == shared
    engine.state.k[:, shared] = 3.0  # what the prompt wrote there
    engine.step()  # both write position 6: one of them gets a copy of the block first
    tables = [engine.cache.block_table(s.seq_id)[1] for s in (parent, child)]
    assert tables[0] != tables[1] and shared in tables
    copy = tables[1] if tables[0] == shared else tables[0]
    assert torch.all(engine.state.k[:, copy, :2] == 3.0)  # positions 4-5 came along with the copy


def test_chosen_logits_decide_the_tokens_and_logprobs(tiny_tokenizer):
    vocab = tiny_tokenizer.vocab_size

    def next_is_plus_one(tokens, positions):  # a model that always continues with token + 1
        logits = torch.full((len(tokens), vocab), -20.0, device=tokens.device)
        logits[torch.arange(len(tokens), device=tokens.device), (tokens + 1) % vocab] = 0.0
        return logits

    engine = scripted_engine(tiny_tokenizer, logits_fn=next_is_plus_one)
    engine.add_request("a", [40, 41], SamplingParams(max_tokens=4, temperature=0.0, logprobs=2, ignore_eos=True))
    engine.add_request("b", [7], SamplingParams(n=2, max_tokens=3, temperature=0.7, seed=3, ignore_eos=True))
    out = run_to_completion(engine)
    assert out["a"][0]["token_ids"] == [42, 43, 44, 45]
    assert all(e.top[0][0] == e.token_id and len(e.top) == 2 for e in out["a"][0]["logprobs"])
    assert abs(out["a"][0]["logprobs"][0].logprob) < 1e-6  # all mass on the chosen token
    assert out["b"][0]["token_ids"] == out["b"][1]["token_ids"] == [8, 9, 10]  # ~no mass elsewhere to sample


def test_cumulative_logprob_does_not_depend_on_what_shares_the_steps(tiny_tokenizer):
    """A request that scores its samples (n > 1, logprobs) sums the same scores alone and in a busy batch; one
    that does not reports 0.0, also in steps where a row beside it made the sampler score every row."""
    scored = SamplingParams(n=2, max_tokens=6, temperature=0.8, seed=5, ignore_eos=True)
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    logprobs = SamplingParams(max_tokens=5, temperature=0.0, logprobs=1, ignore_eos=True)

    def run(requests):
        engine = scripted_engine(tiny_tokenizer)
        for request_id, prompt, params in requests:
            engine.add_request(request_id, prompt, params)
        return run_to_completion(engine)

    alone = {rid: run([(rid, prompt, params)])[rid] for rid, prompt, params in
             [("s", [4, 5], scored), ("p", [8, 9], plain), ("l", [6], logprobs)]}
    busy = run([("p", [8, 9], plain), ("s", [4, 5], scored), ("l", [6], logprobs)])
    assert busy == alone
    assert busy["p"][0]["cumulative_logprob"] == 0.0
    assert all(out["cumulative_logprob"] < 0 for out in busy["s"].values())
    total = 0.0
    for entry in busy["l"][0]["logprobs"]:  # the engine's order of addition
        total += entry.logprob
    assert busy["l"][0]["cumulative_logprob"] == total < 0


class TableCheck:
    """Inside every forward pass: each sequence's blocks (or slot), as the model is given them, are the cache
    manager's own, so a row of the runner's table left stale fails the step; a graph bucket's padding rows
    point at the scratch block or slot. Also counts what the run did to the table."""

    def __init__(self, engine, scratch: int):
        self.engine, self.scratch, self.work = engine, scratch, []
        self.num_checked, self.num_padded, self.num_copies, self.seqs_of_row = 0, 0, 0, {}
        runner, launch = engine.runner, engine.runner.launch

        def launching(batch, inputs_from=None):
            self.work = list(batch.work)
            self.num_copies += sum(op.kind == "copy" for op in batch.cache_ops)
            pending = launch(batch, inputs_from)
            for seq_id, row in runner.table.row_of.items():
                self.seqs_of_row.setdefault(row, set()).add(seq_id)
            return pending

        runner.launch = launching
        self.real_step, engine.loaded.model.step = engine.loaded.model.step, self

    def __call__(self, batch, state):
        cache, work = self.engine.cache, self.work
        given = (batch.block_tables if batch.block_tables is not None else batch.slots[:, None]).tolist()
        assert len(given) >= len(work)
        for (seq, n), row in zip(work, given):
            if batch.block_tables is None:
                assert row == [cache.slot(seq.seq_id)], f"sequence {seq.seq_id} was given a stale slot"
            else:
                needed = -(-(seq.num_computed + n) // cache.block_size)  # the blocks this step reads or writes
                assert row[:needed] == cache.block_table(seq.seq_id)[:needed], f"sequence {seq.seq_id}: stale blocks"
        assert all(set(row) == {self.scratch} for row in given[len(work):])  # padding rows of a graph bucket
        self.num_padded += len(given) > len(work)
        self.num_checked += 1
        return self.real_step(batch, state)

    @property
    def num_reused_rows(self) -> int:
        return sum(len(seqs) > 1 for seqs in self.seqs_of_row.values())


# Forks into samples (copy-on-write of a shared half-full block, then new blocks as they grow), a chunked
# prompt, a beam search, a prompt whose prefix another computed (a prefix-cache hit at admission), and
# requests arriving as others finish (their rows reused), in a cache small enough to preempt.
TABLE_ARRIVALS = {
    0: [("fork", [1, 2, 3, 4, 5, 6], SamplingParams(n=2, max_tokens=9, temperature=1.0, seed=3, ignore_eos=True)),
        ("long", list(range(20, 50)), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))],
    2: [("shared", list(range(60, 69)), SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))],
    4: [("beam", [90, 91, 92], SamplingParams(max_tokens=4, use_beam_search=True, beam_width=2, ignore_eos=True))],
    9: [("hit", list(range(60, 68)) + [80, 81], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))],
    12: [(f"late{i}", [100 + i, 101], SamplingParams(max_tokens=6 + i, temperature=0.7, seed=i, ignore_eos=True))
         for i in range(3)],
}


def table_engine(tokenizer, state_kind: str, mode: str) -> tuple[EngineCore, TableCheck]:
    """A scripted engine, synchronous, overlapped ("async") or replaying graph buckets ("graphs"), every forward
    pass of which `TableCheck` checks."""
    model = ScriptedModel(ScriptedConfig(tokenizer.vocab_size, state_kind=state_kind))
    loaded = LoadedModel("scripted", None, "scripted", model.to(TEST_DEVICE), tokenizer, [0], TEST_DEVICE,
                         torch.float32)
    config = EngineConfig(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
                          CacheConfig(block_size=4, num_blocks=14), enforce_eager=mode != "graphs",
                          async_scheduling=mode == "async")
    engine = EngineCore(loaded, config, max_model_len=64, graph_capture=EmulatedGraphs() if mode == "graphs" else None)
    scratch = engine.cache.num_blocks if state_kind == "paged_kv" else engine.state.num_slots - 1
    return engine, TableCheck(engine, scratch)


def run_table_arrivals(engine) -> dict:
    results, step = {}, 0
    while step <= max(TABLE_ARRIVALS) or engine.has_work():
        for request_id, prompt, params in TABLE_ARRIVALS.get(step, []):
            engine.add_request(request_id, prompt, params)
        collect(results, engine.step())
        step += 1
    return results


@pytest.mark.parametrize("mode", ["sync", "async", "graphs"])
@pytest.mark.parametrize("state_kind", ["paged_kv", "slots"])
def test_every_step_reads_each_sequences_current_blocks_or_slot(tiny_tokenizer, state_kind, mode):
    engine, check = table_engine(tiny_tokenizer, state_kind, mode)
    results = run_table_arrivals(engine)
    assert len(results) == sum(map(len, TABLE_ARRIVALS.values()))
    assert check.num_checked > 15 and check.num_reused_rows > 0
    if state_kind == "paged_kv":
        assert check.num_copies > 0  # copy-on-write
        assert engine.scheduler.num_preemptions > 0 and engine.cache.prefix_hits > 0
    if mode == "async":
        assert engine.num_overlapped_steps > 0
    if mode == "graphs":
        assert check.num_padded > 0
    engine.runner.table.apply(engine.cache.table_edits.take())  # the last frees, which no step carried
    assert engine.cache.usage == 0 and not engine.runner.table.row_of


@pytest.mark.parametrize("forgets", ["appended blocks", "copied blocks", "reused rows"])
def test_a_table_that_misses_one_kind_of_change_fails_the_check(tiny_tokenizer, monkeypatch, forgets):
    """The check above catches a runner that forgets blocks a sequence grew, blocks replaced by their copies on
    write, or the ids of a row that a finished sequence left to a new one."""
    apply, written, used_rows = CacheTable.apply, {}, set()  # written: seq id -> entries of its row written

    def forgetful_apply(table, edits):
        for edit in edits:
            if edit.is_free:
                apply(table, [edit])
                continue
            known = written.get(edit.seq_id, 0)
            skip = (forgets == "appended blocks" and 0 < edit.start >= known
                    or forgets == "copied blocks" and edit.start < known)
            if forgets == "reused rows" and edit.seq_id not in table.row_of and table.free_rows[-1] in used_rows:
                table.row_of[edit.seq_id] = table.free_rows.pop()  # takes the row as the last sequence left it
                skip = True
            if not skip:
                apply(table, [edit])
            written[edit.seq_id] = max(known, edit.start + len(edit.ids))
            used_rows.add(table.row_of[edit.seq_id])

    monkeypatch.setattr(CacheTable, "apply", forgetful_apply)
    engine, _ = table_engine(tiny_tokenizer, "paged_kv", "sync")
    with pytest.raises(AssertionError, match="stale blocks"):
        run_table_arrivals(engine)
