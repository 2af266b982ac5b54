"""The persistent batch: a step's leading rows that decode one token of a plain sampling request, kept from one step
to the next and updated by deltas.

From one decode step to the next almost every sequence decodes one token again with the same settings: what
changes is the few sequences that finished (or were preempted, or aborted) and the few whose prompts just
completed. Re-packing every sequence and gathering its sampling settings again is a Python pass over every running
sequence, several times over; instead the runner keeps these rows' host inputs (sequence, position, cache-table
row, sampling slot, generator) and the sampler's flags from the step before, drops the rows that left, moves
every position one on, and packs only the entries behind them (the tail: new decodes, prompt chunks). Each kept
row's input token is the one the step before sampled for it, still on the device.

A row joins when its sequence decodes one token of a request whose next step needs nothing of the host's but its
cache (Sequence.decodes_on_device: no beams, penalties, min_tokens or grammar) and has no logit bias. A step whose
tail needs more than plain sampling rows (beams, prompt scoring, a fork into n samples, a grammar, penalties,
bias) is packed whole, and so is one whose tail's tokens are still on the device (an overlapped step). When the rows are exactly the step
before's, its inputs stay where they are on the device and only the positions move (`DecodeInputs`, the steady
state).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice, repeat
from operator import attrgetter, is_, itemgetter, ne

import torch

from quill.models.host_copy import host_tensor
from quill.server.sampling.table import RowFlags

from ..sequence import Sequence
from .inputs import LogitRows, Packed, pack
from .sampling_plan import SamplingPlan


@dataclass(slots=True)
class DecodeInputs:
    """A step's host inputs, all of them rows of the persistent batch: the next step of the same sequences reuses
    them as they are, the device's buffers holding them but the positions, moved one on."""

    packed: Packed
    logit_rows: LogitRows
    plan: SamplingPlan


def _joins(seq: Sequence) -> bool:
    return seq.decodes_on_device and not seq.group.params.logit_bias


def _host(values: list[int] | torch.Tensor) -> torch.Tensor:
    return values if isinstance(values, torch.Tensor) else host_tensor(values)


@dataclass
class DecodeRows:
    seqs: list[Sequence]
    seq_ids: list[int]  # theirs, to find a freed one's row without a pass in Python
    # On the host, a value per row: its position in the step that made these rows, its cache-table row, its
    # sampling slot (tensors, so that rows are dropped and uploaded without a pass in Python)
    positions: torch.Tensor
    table_rows: torch.Tensor
    slots: torch.Tensor
    generators: list[torch.Generator | None]
    flags: RowFlags  # the sampler's flags of the step that made these rows: true of these rows too
    plain: bool  # no row of that step scored its samples or asked for log-probabilities
    sampled_ids: torch.Tensor  # (>= rows,) the tokens that step sampled, these rows' first
    longest: int  # tokens of the longest of these sequences, that step's new token included
    whole: DecodeInputs | None  # that step's inputs when these rows were all of it (reused as they are)
    unseeded: bool  # no row has a generator of its own

    @staticmethod
    def of(packed: Packed, logit_rows: LogitRows, plan: SamplingPlan | None, sampled_ids: torch.Tensor | None,
           start: int = 0, longest: int | None = None) -> "DecodeRows | None":
        """The leading rows of a step just launched that join, or None if none does; the first `start` are known
        to (a persistent batch's kept rows). `longest`: at least the longest of them (None: read from the positions,
        a list then)."""
        if plan is None or sampled_ids is None:
            return None
        count = start
        query_lens, rows = packed.query_lens, packed.rows
        for (seq, row), (_, samples) in zip(islice(logit_rows.sampled, start, None), islice(plan.owners, start, None)):
            # in order, one token, one logits row and one sampler row each, before anything else of the step
            if row != count or samples != 1 or query_lens[count] != 1 or rows[count] != count or not _joins(seq):
                break
            count += 1
        if count == 0:
            return None
        whole = None
        if count == len(query_lens) and count == len(rows) and not logit_rows.beam_rows:
            whole = DecodeInputs(packed, logit_rows, plan)
        if longest is None:
            longest = max(packed.positions[:count]) + 1
        generators = plan.generators[:count]
        seqs = list(map(itemgetter(0), logit_rows.sampled[:count]))
        return DecodeRows(seqs, list(map(attrgetter("seq_id"), seqs)), _host(packed.positions)[:count],
                          _host(packed.table_rows)[:count], _host(plan.slots)[:count], generators, plan.flags,
                          plan.plain, sampled_ids, longest, whole, unseeded=generators.count(None) == len(generators))

    def moved(self, sampled_ids: torch.Tensor) -> "DecodeRows":
        """These rows after a step that decoded exactly them, again."""
        return replace(self, positions=self.positions + 1, sampled_ids=sampled_ids, longest=self.longest + 1)

    def keep(self, work: list[tuple[Sequence, int]], freed: set[int]) -> tuple[torch.Tensor | None, list, int]:
        """(the rows that decode their next token in `work`, in order: None for all of them, else their indices;
        their sequences; how many leading entries of `work` they are). A row is dropped when its sequence is not
        there or was freed (finished, or preempted: its cache-table row may differ now)."""
        seqs = self.seqs
        index, kept = None, seqs
        if freed:
            ids = self.seq_ids
            dropped = sorted(ids.index(seq_id) for seq_id in freed if seq_id in ids)
            if dropped:
                index, kept = self._without(dropped)
        count = len(kept)
        # the common case: work starts with exactly the rows that stay, in order, each a one-token decode (checked
        # with C-level maps: this runs every step, over every row)
        leading = work[:count]
        if (len(leading) == count and all(map(is_, map(itemgetter(0), leading), kept))
                and not any(map(ne, map(itemgetter(1), leading), repeat(1)))):
            return index, kept, count
        rows, j, end = [], 0, len(work)  # else walk both: rows whose sequences are not there are dropped
        for i, seq in enumerate(seqs):
            if j < end and work[j][0] is seq and work[j][1] == 1 and seq.seq_id not in freed:
                rows.append(i)
                j += 1
        if len(rows) == len(seqs):
            return None, seqs, j
        index, kept = self._without(sorted(set(range(len(seqs))) - set(rows)))
        return index, kept, j

    def _without(self, dropped: list[int]) -> tuple[torch.Tensor, list[Sequence]]:
        """(indices of every row but `dropped`, their sequences)."""
        seqs, starts = self.seqs, [0] + [i + 1 for i in dropped]  # the runs of rows between dropped ones
        runs = [(start, end) for start, end in zip(starts, dropped + [len(seqs)]) if end > start]
        index = torch.cat([torch.arange(start, end) for start, end in runs] or [torch.zeros(0, dtype=torch.long)])
        return index, [seq for start, end in runs for seq in seqs[start:end]]


def plain_tail(tail: list[tuple[Sequence, int]]) -> bool:
    """Whether the entries behind the kept rows need nothing but plain sampling rows: each of their logits rows
    then serves one sampler row, in order, after the kept rows'."""
    for seq, _ in tail:
        group = seq.group
        p = group.params
        if (p.use_beam_search or p.structured is not None or p.has_penalties or p.min_tokens > 0 or p.logit_bias
                or p.bans_by_history or (not group.is_forked and (p.n > 1 or p.prompt_logprobs is not None))):
            return False
    return True


def delta_inputs(rows: DecodeRows, index: torch.Tensor | None, kept: list[Sequence], tail: list[tuple[Sequence, int]],
                 row_of: dict[int, int]) -> tuple[Packed, LogitRows, torch.Tensor, list, int]:
    """The step's packed inputs and logits rows: the kept rows (`index`: None for all; their positions one on,
    their tokens the step before's samples, on the device), then the tail packed as usual. Also each sampler row's
    slot and generator, and at least the longest sequence among the rows that may join the next persistent batch."""
    k = len(kept)

    def kept_values(values: torch.Tensor) -> torch.Tensor:
        return values if index is None else values.index_select(0, index)

    packed, logit_rows = pack(tail, row_of)  # the tail's rows and tokens come after the kept rows'
    tail_sampled = [(seq, r + k) for seq, r in logit_rows.sampled]
    # at least the longest of the rows that may join the next persistent batch: the kept and the tail's decodes
    rows_longest = max([rows.longest + 1] + [p + 1 for p, n in zip(packed.positions, packed.query_lens) if n == 1])
    positions, table_rows = kept_values(rows.positions) + 1, kept_values(rows.table_rows)
    slots = kept_values(rows.slots)
    generators = rows.generators
    if index is not None:
        generators = [None] * k if rows.unseeded else [generators[i] for i in index.tolist()]
    if tail:
        positions = torch.cat([positions, host_tensor(packed.positions)])
        table_rows = torch.cat([table_rows, host_tensor(packed.table_rows)])
        packed.tokens = torch.cat([torch.zeros(k, dtype=torch.long), host_tensor(packed.tokens)])
        slots = torch.cat([slots, host_tensor([seq.group.slot for seq, _ in tail_sampled])])
        generators = generators + [
            seq.group.generators[seq.index if seq.group.is_forked else 0] if seq.group.generators else None
            for seq, _ in tail_sampled]
    else:
        packed.tokens = torch.zeros(k, dtype=torch.long)
    packed.positions, packed.table_rows = positions, table_rows  # placeholders for tokens: `token_source` holds them
    in_order = packed.rows_in_order or not packed.rows
    packed.rows = list(range(k)) + [r + k for r in packed.rows]
    packed.rows_in_order = in_order
    packed.query_lens[:0] = [1] * k
    packed.longest = max(packed.longest, rows.longest + 1)
    logit_rows.sampled = list(zip(kept, range(k))) + tail_sampled
    sampled_ids = rows.sampled_ids
    if index is None:  # every row stays: its tokens are the front of the samples, in order
        packed.token_source = sampled_ids[:k]
    else:
        packed.token_source = sampled_ids.index_select(0, index.to(sampled_ids.device, non_blocking=True))
    return packed, logit_rows, slots, generators, rows_longest
