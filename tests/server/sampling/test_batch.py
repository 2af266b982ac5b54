import pytest
import torch

from quill.server.sampling.batch import new_generator
from quill.server.sampling.params import SamplingParams
from quill.server.sampling.table import build_batch
from tests.conftest import TEST_DEVICE

V = 10


def build(params, outputs=None, generators=None, eos_token_ids=()):
    rows = len(params)
    return build_batch(
        params, [[1, 2]] * rows, outputs or [[]] * rows, generators or [None] * rows, V, TEST_DEVICE, eos_token_ids
    )


def test_rows_must_line_up():
    with pytest.raises(ValueError, match="one entry per row"):
        build_batch([SamplingParams()] * 2, [[1]], [[], []], [None, None], V, TEST_DEVICE)


def test_greedy_rows_turn_every_filter_off():
    batch = build([SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2), SamplingParams(top_k=-1)])
    assert batch.is_greedy.tolist() == [True, False]
    assert batch.temperature.tolist() == [0.0, 1.0]
    assert batch.top_k.tolist() == [0, 0]
    assert batch.top_p.tolist() == [1.0, 1.0]
    assert batch.min_p.tolist() == [0.0, 0.0]
    assert (batch.max_top_k, batch.uses_top_p, batch.uses_min_p) == (0, False, False)
    assert batch.any_greedy and not batch.all_greedy


def test_flags_follow_the_rows_that_use_each_filter():
    batch = build([SamplingParams(top_k=4), SamplingParams(top_k=3, top_p=0.9), SamplingParams(top_k=V + 1)])
    assert batch.max_top_k == 4  # top_k >= V is off
    assert batch.uses_top_p and not batch.uses_min_p
    assert batch.seen_tokens is None and batch.output_counts is None and batch.bias is None


def test_penalty_tensors_only_when_a_row_needs_them():
    batch = build([SamplingParams(repetition_penalty=1.3), SamplingParams()], outputs=[[3], [4, 4]])
    assert batch.seen_tokens[0].nonzero().flatten().tolist() == [1, 2, 3]
    assert batch.output_counts is None
    batch = build([SamplingParams(frequency_penalty=0.5), SamplingParams()], outputs=[[3], [4, 4]])
    assert batch.seen_tokens is None
    assert batch.output_counts[1, 4] == 2


def test_logit_bias_is_flattened_and_ids_past_the_vocab_skipped():
    batch = build([SamplingParams(), SamplingParams(logit_bias={2: 1.5, V: 3.0, 7: -2.0})])
    rows, token_ids, values = batch.bias
    assert rows.tolist() == [1, 1] and token_ids.tolist() == [2, 7] and values.tolist() == [1.5, -2.0]


def test_seeded_rows_are_the_random_rows_with_a_generator():
    generators = [new_generator(1, TEST_DEVICE), new_generator(2, TEST_DEVICE), None]
    batch = build([SamplingParams(temperature=0.0), SamplingParams(), SamplingParams()], generators=generators)
    assert [row for row, _ in batch.seeded_rows] == [1]
    assert batch.seeded_rows[0][1] is generators[1]


def test_num_top_logprobs_is_the_widest_request():
    assert build([SamplingParams(logprobs=3), SamplingParams(logprobs=0), SamplingParams()]).num_top_logprobs == 3
    assert build([SamplingParams()]).num_top_logprobs == 0


def test_new_generator_is_reproducible():
    a, b = new_generator(11, TEST_DEVICE), new_generator(11, TEST_DEVICE)
    assert torch.equal(torch.rand(4, generator=a, device=TEST_DEVICE), torch.rand(4, generator=b, device=TEST_DEVICE))
