"""Which decode steps replay a captured CUDA graph, and at which batch size.

A graph replays fixed shapes, so graphs are captured for a few batch sizes ("buckets"): 1, 2, 4, 8,
then steps of 16 up to the most sequences a step may hold. A step replays the smallest bucket that
fits it when every sequence brings exactly one token (decodes; beams and n > 1 samples are decodes
too); its rows past the real ones are padding. Any step with a longer query (a prompt, or a chunk of
one), or more sequences than the largest bucket, runs eagerly. Plain Python: tested without a GPU.
"""

from __future__ import annotations

from bisect import bisect_left

SMALL_SIZES = (1, 2, 4, 8)
SIZE_STEP = 16  # above the small sizes: every multiple of this


def graph_batch_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """The buckets, ascending; the largest is the most sequences a decode step can hold."""
    largest = min(max_num_seqs, max_num_batched_tokens)  # a decode step brings one token per sequence
    sizes = [s for s in SMALL_SIZES if s < largest]
    sizes += range(SIZE_STEP, largest, SIZE_STEP)
    return sorted({*sizes, largest})


def choose_bucket(query_lens: list[int], sizes: list[int]) -> int | None:
    """The bucket a step with these query lengths replays, or None when it must run eagerly."""
    if not query_lens or not sizes or any(n != 1 for n in query_lens):
        return None
    i = bisect_left(sizes, len(query_lens))
    return sizes[i] if i < len(sizes) else None
