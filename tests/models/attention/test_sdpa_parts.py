"""A step mixing decodes with prompt chunks runs in parts (decodes together, each chunk alone) and equals the
whole step padded together."""

from __future__ import annotations

import pytest
import torch

from quill.models.attention.sdpa import SdpaPagedAttention
from quill.models.batch import StepBatch
from tests.conftest import build_tiny_model

V = 300


class PaddedTogether(SdpaPagedAttention):
    """The whole step padded to its longest chunk, never in parts."""

    @classmethod
    def build(cls, batch: StepBatch, block_size: int):
        built = super().build(batch, block_size)
        if built.parts is not None:
            key_pos = torch.arange(batch.block_tables.shape[1] * block_size)
            built.mask = (key_pos[None, None, :] <= batch.pad(batch.positions)[:, :, None]).unsqueeze(1)
            built.parts = None
        return built


# (sequences, new tokens each): prompts; then decodes around a chunk (decodes not contiguous); then decodes
# first with two chunks behind them (a persistent batch's order); then a decode-only step.
STEPS = [([0, 1, 2, 3], [5, 3, 9, 2]), ([0, 1, 2, 3], [1, 6, 1, 1]), ([0, 2, 1, 3], [1, 1, 4, 7]),
         ([0, 1, 2, 3], [1, 1, 1, 1])]


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_a_mixed_step_in_parts_equals_it_padded_together(key):
    _, model = build_tiny_model(key, V, device="cpu")
    block_size = 4
    tables = [[3, 17, 8, 30, 21, 0], [12, 5, 26, 1, 2, 4], [9, 33, 2, 14, 27, 6], [19, 24, 11, 35, 36, 37]]
    parts = model.new_state(40, block_size=block_size, attention_backend="sdpa")
    padded = model.new_state(40, block_size=block_size)
    padded.attention = PaddedTogether
    g = torch.Generator().manual_seed(0)
    lengths = [0, 0, 0, 0]
    seen_parts = 0
    for seqs, counts in STEPS:
        new = [torch.randint(0, V, (n,), generator=g).tolist() for n in counts]
        batch = StepBatch.build(new, [lengths[i] for i in seqs], block_tables=[tables[i] for i in seqs],
                                logits="all")
        built = SdpaPagedAttention.build(batch, block_size)
        seen_parts += built.parts is not None
        torch.testing.assert_close(model.step(batch, parts), model.step(batch, padded), atol=1e-5, rtol=1e-5)
        for i, n in zip(seqs, counts):
            lengths[i] += n
    assert seen_parts == 3  # the first three steps mix lengths; the decode-only step is one part


def test_decodes_of_very_different_contexts_run_in_groups_equal_to_them_padded_together():
    _, model = build_tiny_model("transformer-llama", V, device="cpu")
    block_size, num_seqs = 4, 40
    lengths = [1 + (i * 7) % 37 for i in range(num_seqs)]  # 1..37 tokens of context, mixed in order
    tables = [[i * 10 + j for j in range(10)] for i in range(num_seqs)]
    grouped = model.new_state(num_seqs * 10, block_size=block_size, attention_backend="sdpa")
    padded = model.new_state(num_seqs * 10,
                                                                                            block_size=block_size)
    padded.attention = PaddedTogether
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]
    first = StepBatch.build(prompts, [0] * num_seqs, block_tables=tables)
    model.step(first, grouped), model.step(first, padded)
    # decodes, with a chunk among them: the decodes are not contiguous either
    new = [[5] if i != 3 else [6, 7, 8] for i in range(num_seqs)]
    for step in (StepBatch.build(new, lengths, block_tables=tables, logits="all"),
                 StepBatch.build([[9]] * num_seqs, [n + len(t) for n, t in zip(lengths, new)], block_tables=tables)):
        built = SdpaPagedAttention.build(step, block_size)
        assert built.parts is not None and sum(p.query_len == 1 for p in built.parts) > 1  # decodes in groups
        torch.testing.assert_close(model.step(step, grouped), model.step(step, padded), atol=1e-5, rtol=1e-5)
