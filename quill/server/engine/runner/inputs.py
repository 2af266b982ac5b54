"""A step's inputs: the scheduled tokens packed back to back as host lists (`pack`), which logits rows serve
what (`LogitRows`), and the persistent, max-sized device buffers they are copied into (`InputBuffers`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from quill.models.batch import StepBatch
from quill.models.host_copy import host_tensor

from ..cache.cache_table import CacheTable
from ..sequence import Sequence, SequenceGroup
from ..cache.state_kinds import StateLayout


@dataclass
class Packed:
    """A step's new tokens, packed back to back, as host lists."""

    # Lists, or host tensors where a persistent batch keeps its rows' values (decode_rows.py)
    tokens: list[int] | torch.Tensor = field(default_factory=list)
    positions: list[int] | torch.Tensor = field(default_factory=list)
    rows: list[int] | torch.Tensor = field(default_factory=list)  # packed token index of each logits row
    table_rows: list[int] | torch.Tensor = field(default_factory=list)  # per sequence: its cache-table row
    query_lens: list[int] = field(default_factory=list)
    longest: int = 0  # tokens of the step's longest sequence, counting its new ones
    token_source: torch.Tensor | None = None  # (rows,) input tokens already on the device (ModelRunner.launch)
    rows_in_order: bool = False  # `rows` is 0, 1, 2, ...: a logits row per token


@dataclass
class LogitRows:
    """Which logits rows of the step serve what."""

    sampled: list[tuple[Sequence, int]] = field(default_factory=list)  # sequence, its next-token row
    beam_rows: dict[SequenceGroup, dict[Sequence, int]] = field(default_factory=dict)
    scored: list[tuple[Sequence, int, int, int]] = field(default_factory=list)  # seq, first row, first pos, count
    argmax_only: torch.Tensor | None = None  # (rows,) bool: only its argmax was scored (StepBatch.argmax_only)

    def next_token_seqs(self) -> list[Sequence]:
        """Every sequence that picks its next token this step (sampled or as a beam)."""
        return [seq for seq, _ in self.sampled] + [seq for rows_of in self.beam_rows.values() for seq in rows_of]


def pack(work: list[tuple[Sequence, int]], row_of: dict[int, int]) -> tuple[Packed, LogitRows]:
    """The step's inputs as host lists, and which logits rows serve what. `row_of`: each sequence's row of the
    runner's cache table, by sequence id."""
    logit_rows = LogitRows()
    packed = Packed()
    tokens, positions, rows, table_rows = packed.tokens, packed.positions, packed.rows, packed.table_rows
    offset = longest = 0
    for seq, n in work:
        start = seq.num_computed
        token_ids = seq.token_ids
        if n == 1:  # a decode; its token is still on the device when the step overlaps the previous one
            tokens.append(token_ids[start] if start < len(token_ids) else 0)
            positions.append(start)
        else:
            tokens += token_ids[start : start + n]
            positions += range(start, start + n)
        table_rows.append(row_of[seq.seq_id])
        group = seq.group
        end = start + n
        if end > longest:
            longest = end
        completes = end >= len(token_ids)
        if group.params.prompt_logprobs is not None and not group.is_forked:
            count = min(n, seq.num_prompt_tokens - 1 - start)  # rows predicting prompt tokens
            if count > 0:
                logit_rows.scored.append((seq, len(rows), start, count))
            rows.extend(range(offset, offset + n))
            last_row = len(rows) - 1
        elif completes:
            last_row = len(rows)
            rows.append(offset + n - 1)
        if completes:
            if group.params.use_beam_search:
                logit_rows.beam_rows.setdefault(group, {})[seq] = last_row
            else:
                logit_rows.sampled.append((seq, last_row))
        offset += n
    packed.query_lens = [n for _, n in work]
    packed.longest = longest
    packed.rows_in_order = len(rows) == len(tokens) and rows == list(range(len(rows)))
    return packed, logit_rows


class InputBuffers:
    """The persistent device buffers a step's inputs are copied into, each as long as a step can be (one
    host-to-device copy per field a step), and the views of them a step or a graph's bucket reads."""

    def __init__(self, max_tokens: int, max_num_seqs: int, table: CacheTable, layout: StateLayout,
                 device: torch.device):
        self.table, self.layout = table, layout
        self.token_ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.logits_indices = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.sample_slots = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        self.table_rows = torch.zeros(max_num_seqs, dtype=torch.long, device=device)  # the step's rows of `table`
        self.in_order = torch.arange(max_tokens, device=device)  # logits indices of a step with a row per token

    @staticmethod
    def upload(buffer: torch.Tensor, values: list[int] | torch.Tensor) -> torch.Tensor:
        """One host-to-device copy into the front of a persistent buffer; returns that view. `values`: a list, or a
        tensor on the host (no conversion: a list of 256 ints costs ~20 us to make into one)."""
        view = buffer[: len(values)]
        if not isinstance(values, torch.Tensor):
            values = host_tensor(values, buffer.dtype)
        view.copy_(values, non_blocking=True)
        return view

    def splice_tokens(self, packed: Packed) -> None:
        """Overwrite the placeholder input tokens with those still on the device (ModelRunner.launch)."""
        if packed.token_source is not None:
            self.token_ids[: packed.token_source.shape[0]].copy_(packed.token_source)

    def step_batch(self, packed: Packed, argmax_only: torch.Tensor | None = None, upload: bool = True) -> StepBatch:
        """An eager step's input: the fronts of the buffers, block tables as wide as the longest sequence of the
        step needs. `upload`: copy `packed` into the buffers (False: they hold it already)."""
        put = self.upload if upload else lambda buffer, values: buffer[: len(values)]
        token_ids = put(self.token_ids, packed.tokens)
        if upload:
            self.splice_tokens(packed)
        step = StepBatch(
            token_ids=token_ids,
            positions=put(self.positions, packed.positions),
            query_lens=packed.query_lens,
            logits_indices=self.in_order[: len(packed.rows)] if packed.rows_in_order
            else put(self.logits_indices, packed.rows),
            argmax_only=argmax_only,
        )
        rows = put(self.table_rows, packed.table_rows)
        self.layout.locate(step, self.table.gather(rows, self.layout.columns(packed.longest)))
        return step

    def fill_bucket(self, packed: Packed, size: int) -> None:
        """Write a step's inputs into a graph bucket's views; rows past the real ones are padding: token 0 at
        position 0 in the table's padding row, whose K,V or state goes to the scratch block or slot."""
        real = len(packed.tokens)
        if real > size:
            raise ValueError(f"{real} rows do not fit a bucket of {size}")
        for buffer, values, padding in ((self.token_ids, packed.tokens, 0), (self.positions, packed.positions, 0),
                                        (self.table_rows, packed.table_rows, self.table.padding_row)):
            self.upload(buffer, values)
            buffer[real:size].fill_(padding)
        self.splice_tokens(packed)

    def bucket_step(self, size: int) -> StepBatch:
        """The decode step a bucket's graph runs: one token per row over fixed views of the buffers; the rows'
        blocks (every column: the longest sequence's width) or slots gathered on the device."""
        step = StepBatch(token_ids=self.token_ids[:size], positions=self.positions[:size], query_lens=[1] * size)
        self.layout.locate(step, self.table.gather(self.table_rows[:size], self.table.width))
        return step
