"""The grammar's mask in the batched sampler: constrained rows pick only allowed tokens, the others are untouched."""

from __future__ import annotations

import torch

from quill.server.sampling import SamplingParams, build_batch, sample
from quill.server.sampling.processors import apply_allowed_tokens, unpack_bitmask

V = 70  # not a multiple of 32: the last mask word is partly past the vocabulary


def bitmask_of(allowed: list[list[int]]) -> torch.Tensor:
    words = torch.zeros(len(allowed), (V + 31) // 32, dtype=torch.int64)
    for row, ids in enumerate(allowed):
        for t in ids:
            words[row, t // 32] |= 1 << (t % 32)
    return words.to(torch.int32)  # bit 31 set wraps to a negative int32, as llguidance writes it


def test_unpack_matches_the_bits():
    allowed = [[0, 31, 32, 69], [5]]
    unpacked = unpack_bitmask(bitmask_of(allowed), V)
    assert [row.nonzero().flatten().tolist() for row in unpacked] == allowed


def test_only_the_masked_rows_change():
    logits = torch.randn(4, V)
    rows = torch.tensor([1, 3])
    out = apply_allowed_tokens(logits, rows, bitmask_of([[2, 40], [31]]))
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [2, 40]
    assert torch.isfinite(out[3]).nonzero().flatten().tolist() == [31]


def test_constrained_rows_sample_allowed_tokens_and_free_rows_sample_as_without():
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 3
    params = [SamplingParams(temperature=1.0, seed=11 + i, top_k=20, repetition_penalty=1.2) for i in range(4)]
    prompts, outputs = [[1, 2, 3]] * 4, [[4]] * 4

    def run(allowed):
        generators = [torch.Generator().manual_seed(p.seed) for p in params]
        batch = build_batch(params, prompts, outputs, generators, V, "cpu", allowed=allowed)
        return sample(logits, batch)

    free = run(None)
    allowed_ids = [[7, 9, 33], [68]]
    constrained = run((torch.tensor([0, 2]), bitmask_of(allowed_ids)))
    assert constrained.token_ids[0].item() in allowed_ids[0]
    assert constrained.token_ids[2].item() == 68
    assert constrained.token_ids[[1, 3]].tolist() == free.token_ids[[1, 3]].tolist()
    # Log-probabilities stay those of the raw model, constrained or not.
    assert torch.equal(constrained.logprobs[[1, 3]], free.logprobs[[1, 3]])
