"""Decode steps replayed as CUDA graphs: one graph per batch size (a bucket), captured at startup; a decode-only
step runs the smallest bucket that holds it, its rows past the real ones padding (see cuda_graphs.py and
graph_buckets.py). None are captured on the CPU or with --enforce-eager: every step then runs eagerly."""

from __future__ import annotations

from functools import partial

import torch

from quill.models.host_copy import to_device

from ..cuda_graphs import GraphCapture, GraphCaptureError, Replay
from ..graph_buckets import choose_bucket
from .inputs import InputBuffers, Packed


class DecodeGraphs:
    def __init__(self, model, state, buffers: InputBuffers):
        self.model, self.state, self.buffers = model, state, buffers
        self.sizes: list[int] = []  # the captured buckets, ascending
        self.graphs: dict[int, Replay] = {}

    def __bool__(self) -> bool:
        return bool(self.graphs)

    def clear(self) -> None:
        self.graphs.clear()
        self.sizes = []

    @torch.inference_mode()
    def capture(self, capture: GraphCapture, sizes: list[int]) -> None:
        """Record a decode step for each batch size in `sizes`, largest first. The padding rows of a bucket, and
        the warm-up runs before each capture, write only to the scratch block and slot that no cache manager
        ever hands out (the table's padding row points there)."""
        buffers = self.buffers
        buffers.table.fill_padding(buffers.layout.padding())
        for size in sorted(sizes, reverse=True):
            buffers.fill_bucket(Packed(), size)  # every row is padding while capturing
            try:
                self.graphs[size] = capture.capture(partial(self._bucket_step, size))
            except RuntimeError as e:
                raise GraphCaptureError(size, e) from e
        self.sizes = sorted(sizes)

    def _bucket_step(self, size: int) -> torch.Tensor:
        """What a bucket's graph runs: logits for every row. Nothing changes between replays but the buffers'
        contents."""
        return self.model.step(self.buffers.bucket_step(size), self.state)

    def bucket_for(self, query_lens: list[int]) -> int | None:
        """The bucket a step replays, or None: it runs eagerly (a prompt chunk, or more rows than any bucket)."""
        return choose_bucket(query_lens, self.sizes)

    def replay(self, packed: Packed, size: int, fill: bool = True) -> torch.Tensor:
        """The step's logit rows, from the bucket's graph; padding rows' logits are never read. `fill`: write the
        inputs into the buffers (False: they are there already)."""
        if fill:
            self.buffers.fill_bucket(packed, size)
        logits = self.graphs[size]()  # (size, V): a row per sequence
        if packed.rows_in_order:
            return logits[: len(packed.rows)]
        return logits.index_select(0, to_device(packed.rows, logits.device, torch.long))
