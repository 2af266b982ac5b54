"""The runner without a real model: what it packs for the model, what it applies, what it hands back."""

from __future__ import annotations

import torch

from server.sampling import SamplingParams
from tests.server.engine.helpers import run_to_completion, scripted_engine


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
