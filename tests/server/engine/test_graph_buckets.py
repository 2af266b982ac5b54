"""Which steps replay a graph, at which batch size, and how a bucket is padded: no GPU, no model."""

from __future__ import annotations

import pytest
import torch

from quill.server.engine.cache.cache_table import CacheTable
from quill.server.engine.graph_buckets import choose_bucket, graph_batch_sizes
from quill.server.engine.runner.inputs import InputBuffers, Packed


def test_sizes_are_powers_of_two_to_eight_then_steps_of_sixteen():
    assert graph_batch_sizes(64, 2048) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(256, 2048)[-3:] == [224, 240, 256]


def test_the_largest_size_is_the_most_sequences_a_decode_step_holds():
    assert graph_batch_sizes(40, 2048) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_batch_sizes(5, 2048) == [1, 2, 4, 5]
    assert graph_batch_sizes(1, 2048) == [1]
    assert graph_batch_sizes(64, 20) == [1, 2, 4, 8, 16, 20]  # a step packs no more tokens than its budget


def test_a_decode_step_takes_the_smallest_bucket_that_holds_it():
    sizes = graph_batch_sizes(64, 2048)
    assert [choose_bucket([1] * n, sizes) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 48, 63, 64)] == [
        1, 2, 4, 4, 8, 8, 16, 16, 32, 48, 48, 64, 64]


def test_steps_with_a_longer_query_or_more_sequences_run_eagerly():
    sizes = graph_batch_sizes(16, 2048)
    assert choose_bucket([1] * 17, sizes) is None  # past the largest bucket
    assert choose_bucket([1, 1, 5, 1], sizes) is None  # a prompt chunk among decodes
    assert choose_bucket([7], sizes) is None  # a prompt alone
    assert choose_bucket([], sizes) is None
    assert choose_bucket([1, 1], []) is None  # no graphs captured (the CPU, --enforce-eager)


def test_padding_fills_a_bucket_after_the_real_rows():
    table = CacheTable(4, 1, "cpu")
    buffers = InputBuffers(8, 4, table, None, torch.device("cpu"))
    buffers.token_ids.fill_(-1)
    buffers.fill_bucket(Packed(tokens=[7, 8, 9], positions=[4, 5, 6], table_rows=torch.tensor([2, 0, 1])), 4)
    assert buffers.token_ids[:5].tolist() == [7, 8, 9, 0, -1]  # the bucket's rows only
    assert buffers.positions[:4].tolist() == [4, 5, 6, 0]
    assert buffers.table_rows[:4].tolist() == [2, 0, 1, table.padding_row]  # padding rows read the padding row
    with pytest.raises(ValueError, match="do not fit"):
        buffers.fill_bucket(Packed(tokens=[1, 2, 3], positions=[0, 0, 0], table_rows=[0, 1, 2]), 2)
