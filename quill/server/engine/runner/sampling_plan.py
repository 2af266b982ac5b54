"""The host's half of sampling: which logits rows sample for which sequences, and their settings gathered on the
device (`plan_sampling`, or `plan_plain` for a persistent batch's rows); which rows need only their argmax
(`argmax_only`)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import torch

from quill.models.host_copy import to_device
from quill.server.sampling import SamplingBatch
from quill.server.sampling.table import RowFlags, SamplingTable

from ..grammar_masks import PendingMasks
from ..sequence import Sequence
from .inputs import InputBuffers, LogitRows


@dataclass(slots=True)
class SamplingPlan:
    """A step's sampling, as far as the host decides it (see `plan_sampling`)."""

    num_rows: int  # sampler rows: one per sequence, n for a prompt that forks into n samples
    picked: torch.Tensor | None  # (num_rows,) the logits row of each sampler row; None: rows 0, 1, ... in order
    batch: SamplingBatch  # the sampler's settings, gathered on the device
    owners: list[tuple[Sequence, int]]  # each sampling sequence (`LogitRows.sampled`'s order), its sampler rows
    plain: bool  # one token per sequence, and none asks for log-probabilities or scores its samples
    slots: list[int] | torch.Tensor  # each sampler row's sampling slot (a host tensor for a persistent batch)
    generators: list  # each sampler row's generator (a seeded request's), or None
    flags: RowFlags


def plan_sampling(logit_rows: LogitRows, masks: PendingMasks | None, table: SamplingTable, buffers: InputBuffers,
                  eos_token_ids: list[int]) -> SamplingPlan | None:
    """Which logits rows sample for whom, and the sampler's settings gathered on the device; None when no sequence
    samples this step."""
    rows, slots, params, generators, owners = [], [], [], [], []
    needs_tokens = False
    for seq, row in logit_rows.sampled:
        group = seq.group
        p = group.params
        # A prompt that just completed samples the first token of each of its n outputs.
        indices = range(p.n) if not group.is_forked else (seq.index,)
        for i in indices:
            rows.append(row)
            slots.append(group.slot)
            params.append(p)
            generators.append(group.generators[i] if group.generators else None)
        owners.append((seq, len(indices)))
        needs_tokens = needs_tokens or p.has_penalties or p.min_tokens > 0
    if not rows:
        return None
    prompt_ids = output_ids = None
    if needs_tokens:
        expanded = [seq for seq, count in owners for _ in range(count)]
        prompt_ids = [s.token_ids[: s.num_prompt_tokens] for s in expanded]
        output_ids = [s.output_token_ids for s in expanded]
    allowed = None
    if masks is not None:
        allowed = masks.allowed([seq for seq, count in owners for _ in range(count)])
    sbatch = table.gather(buffers.upload(buffers.sample_slots, slots), params, generators, prompt_ids, output_ids,
                          eos_token_ids, allowed)
    flags = RowFlags(sbatch.max_top_k, sbatch.uses_top_p, sbatch.uses_min_p, sbatch.all_greedy, sbatch.any_greedy,
                     sbatch.num_top_logprobs, sbatch.needs_logprobs)
    device = buffers.sample_slots.device
    picked = None if rows == list(range(len(rows))) else to_device(rows, device)  # None: rows 0, 1, ...
    plain = len(rows) == len(owners) and not any(p.scores_samples for p in params)  # no scores, no logprobs
    return SamplingPlan(len(rows), picked, sbatch, owners, plain, slots, generators, flags)


def plan_plain(seqs: list[Sequence], slots: torch.Tensor, generators: list, flags: RowFlags, plain: bool,
               table: SamplingTable, buffers: InputBuffers) -> SamplingPlan:
    """The plan of a step whose logits rows each sample one token for one sequence, in order, with settings that
    need no token lists, bias or grammar (a persistent batch's, decode_rows.py): `flags` and `plain` come from the
    caller; the settings are gathered by slot on the device."""
    seeded = []
    if generators.count(None) != len(generators):
        seeded = [(row, g) for row, (g, seq) in enumerate(zip(generators, seqs))
                  if g is not None and not seq.group.params.is_greedy]
    sbatch = table.gather_plain(buffers.upload(buffers.sample_slots, slots), flags, seeded)
    return SamplingPlan(len(seqs), None, sbatch, list(zip(seqs, repeat(1))), plain, slots, generators, flags)


def argmax_only(logit_rows: LogitRows, num_rows: int, device: torch.device) -> torch.Tensor | None:
    """(logits rows,) bool on the device: whether only a row's argmax is read (SamplingParams.needs_only_argmax);
    None when no row is."""
    marks = [False] * num_rows
    for seq, row in logit_rows.sampled:
        marks[row] = seq.group.params.needs_only_argmax(seq.num_output_tokens)
    return to_device(marks, device, torch.bool) if any(marks) else None
