"""Incremental decoding equals one full forward pass, for every architecture."""

from __future__ import annotations

import pytest
import torch

from quill.models.batch import StepBatch
from tests.conftest import TEST_DEVICE, TINY_CONFIGS, build_tiny_model

BLOCK_SIZE = 4
V = 300


class Cache:
    """Just enough bookkeeping to drive `model.step` in tests: one slot or a run of blocks per sequence."""

    def __init__(self, model, num_seqs: int, max_len: int = 64, device: torch.device = TEST_DEVICE):
        self.model = model
        self.device = device
        self.paged = model.state_kind == "paged_kv"
        blocks_per_seq = -(-max_len // BLOCK_SIZE)
        if self.paged:
            self.state = model.new_state(num_seqs * blocks_per_seq + 8, block_size=BLOCK_SIZE)
            self.tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(num_seqs)]
        else:
            self.state = model.new_state(num_seqs + 2)
        self.lengths = [0] * num_seqs

    def run(self, seq_ids: list[int], new_tokens: list[list[int]], logits: str = "all") -> list[torch.Tensor]:
        where = (
            dict(block_tables=[self.tables[i] for i in seq_ids]) if self.paged else dict(slots=seq_ids)
        )
        batch = StepBatch.build(new_tokens, [self.lengths[i] for i in seq_ids], logits=logits, device=self.device,
                                **where)
        out = self.model.step(batch, self.state)
        for i, toks in zip(seq_ids, new_tokens):
            self.lengths[i] += len(toks)
        rows = batch.query_lens if logits == "all" else [1] * len(seq_ids)
        return list(out.split(rows))


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens], device=TEST_DEVICE))[0]


@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_prefill_then_steps_in_a_mixed_batch_equal_full_forward(key):
    _, model = build_tiny_model(key, V)
    g = torch.Generator().manual_seed(1)
    lengths = [9, 3, 17, 1]
    seqs = [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]
    expected = [full_logits(model, s) for s in seqs]
    cache = Cache(model, len(seqs))
    got: list[list[torch.Tensor]] = [[] for _ in seqs]
    # Step 1: prefill part of each prompt. Then a mix of chunked prefill (seq 2) and single tokens.
    first = [2, 1, 5, 1]
    for i, out in enumerate(cache.run(list(range(4)), [s[:n] for s, n in zip(seqs, first)])):
        got[i].append(out)
    while True:
        active = [i for i in range(4) if cache.lengths[i] < lengths[i]]
        if not active:
            break
        chunks = [seqs[i][cache.lengths[i] : cache.lengths[i] + (4 if i == 2 else 1)] for i in active]
        for i, out in zip(active, cache.run(active, chunks)):
            got[i].append(out)
    for i in range(4):
        torch.testing.assert_close(torch.cat(got[i]), expected[i], atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_last_token_logits_only(key):
    _, model = build_tiny_model(key, V)
    seqs = [[5, 6, 7, 8, 9], [10, 11]]
    cache = Cache(model, 2)
    last = cache.run([0, 1], seqs, logits="last")
    for s, out in zip(seqs, last):
        torch.testing.assert_close(out[0], full_logits(model, s)[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", list(TINY_CONFIGS))
def test_forked_state_continues_like_two_independent_runs(key):
    _, model = build_tiny_model(key, V)
    prompt = [3, 14, 15, 92, 65, 35]  # 6 tokens: one full block and a half-filled one
    left, right = [89, 79, 32, 38], [46, 26, 43]
    cache = Cache(model, 2)
    cache.run([0], [prompt])
    # Fork sequence 0 into sequence 1.
    if cache.paged:
        full_blocks = len(prompt) // BLOCK_SIZE
        shared = cache.tables[0][:full_blocks]  # full blocks are shared, the partial one is copied on write
        partial_src, partial_dst = cache.tables[0][full_blocks], cache.tables[1][0]
        cache.state.copy_blocks([partial_src], [partial_dst])
        cache.tables[1] = shared + [partial_dst] + cache.tables[1][1:]
    else:
        cache.state.copy([0], [1])
    cache.lengths[1] = len(prompt)
    out_left, out_right = [], []
    for t in range(max(len(left), len(right))):
        ids = [i for i, branch in enumerate((left, right)) if t < len(branch)]
        outs = cache.run(ids, [[(left, right)[i][t]] for i in ids])
        for i, o in zip(ids, outs):
            (out_left, out_right)[i].append(o)
    torch.testing.assert_close(torch.cat(out_left), full_logits(model, prompt + left)[len(prompt):], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(out_right), full_logits(model, prompt + right)[len(prompt):], atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", ["lstm", "gcnn"])
def test_reset_slot_gives_a_fresh_sequence(key):
    _, model = build_tiny_model(key, V)
    cache = Cache(model, 1)
    cache.run([0], [[1, 2, 3, 4]])
    cache.state.reset([0])
    cache.lengths[0] = 0
    out = cache.run([0], [[7, 8, 9]])[0]
    torch.testing.assert_close(out, full_logits(model, [7, 8, 9]), atol=1e-5, rtol=0)


def test_kv_cache_memory_is_proportional_to_blocks():
    _, model = build_tiny_model("transformer-llama", V)
    state = model.new_state(10, block_size=BLOCK_SIZE)
    c = model.config
    assert state.bytes_per_token == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
    assert state.k.numel() * 4 * 2 == state.bytes_per_block * 10
