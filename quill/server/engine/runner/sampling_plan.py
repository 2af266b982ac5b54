"""The host's half of sampling: which logits rows sample for which sequences, and their settings gathered on the
device (`plan_sampling`); which rows need only their argmax (`argmax_only`); and the inputs a decode step leaves
for the next step of the same sequences (`DecodeInputs`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quill.models.host_copy import to_device
from quill.server.sampling import SamplingBatch
from quill.server.sampling.table import SamplingTable

from ..grammar_masks import PendingMasks
from ..sequence import Sequence
from .inputs import InputBuffers, LogitRows, Packed


@dataclass(slots=True)
class SamplingPlan:
    """A step's sampling, as far as the host decides it (see `plan_sampling`)."""

    num_rows: int  # sampler rows: one per sequence, n for a prompt that forks into n samples
    picked: torch.Tensor | None  # (num_rows,) the logits row of each sampler row; None: rows 0, 1, ... in order
    batch: SamplingBatch  # the sampler's settings, gathered on the device
    owners: list[tuple[Sequence, int]]  # each sampling sequence (`LogitRows.sampled`'s order), its sampler rows
    reusable: bool  # nothing in it depends on this step's tokens
    plain: bool  # one token per sequence, and none asks for log-probabilities or scores its samples


@dataclass(slots=True)
class DecodeInputs:
    """A decode step's host inputs, which the next step of the same sequences reuses (ModelRunner._repeat_of)."""

    packed: Packed
    logit_rows: LogitRows
    plan: SamplingPlan

    @staticmethod
    def of(packed: Packed, logit_rows: LogitRows, plan: SamplingPlan | None) -> "DecodeInputs | None":
        """A step's inputs when they serve the next step of the same sequences: every sequence decodes one token
        and samples it with settings that do not change from step to step; else None."""
        if (plan is not None and plan.reusable and plan.num_rows == len(plan.owners) and not logit_rows.beam_rows
                and not logit_rows.scored and len(packed.tokens) == len(packed.query_lens)):
            return DecodeInputs(packed, logit_rows, plan)
        return None


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
    device = buffers.sample_slots.device
    picked = None if rows == list(range(len(rows))) else to_device(rows, device)  # None: rows 0, 1, ...
    # Settings that change from step to step (penalties, min_tokens bans, grammar masks) cannot be reused.
    plain = len(rows) == len(owners) and not any(p.scores_samples for p in params)  # no scores, no logprobs
    return SamplingPlan(len(rows), picked, sbatch, owners, reusable=not needs_tokens and allowed is None, plain=plain)


def argmax_only(logit_rows: LogitRows, num_rows: int, device: torch.device) -> torch.Tensor | None:
    """(logits rows,) bool on the device: whether only a row's argmax is read (SamplingParams.needs_only_argmax);
    None when no row is."""
    marks = [False] * num_rows
    for seq, row in logit_rows.sampled:
        marks[row] = seq.group.params.needs_only_argmax(seq.num_output_tokens)
    return to_device(marks, device, torch.bool) if any(marks) else None
