"""The model runner: one scheduled batch in, its tokens out (the package's docstring says how a step goes)."""

from __future__ import annotations

import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.models.host_copy import to_device
from quill.server.sampling.table import RowFlags, SamplingTable

from ..cache.cache_table import CacheTable
from ..cuda_graphs import GraphCapture
from ..grammar_masks import GrammarMasks
from ..scheduler import ScheduledBatch
from ..cache.state_kinds import StateLayout
from .graphs import DecodeGraphs
from .decode_rows import DecodeRows, delta_inputs, plain_tail
from .inputs import InputBuffers, LogitRows, Packed, pack
from .read_out import PendingStep, StepResult, add_coverage, read_out
from .sampling_plan import SamplingPlan, argmax_only, plan_plain, plan_sampling


class ModelRunner:
    def __init__(self, loaded: LoadedModel, layout: StateLayout, max_num_seqs: int, max_num_batched_tokens: int):
        self.loaded = loaded
        self.model = loaded.model
        self.layout = layout  # the model's state, and where each sequence's share of it is (state_kinds.py)
        self.state = layout.state
        self.device = device = loaded.device
        self.vocab_size = self.model.config.vocab_size
        # The model scores a row whose argmax alone is read for less than its full distribution (fconv's adaptive
        # softmax): eager steps tell it which rows those are (StepBatch.argmax_only); graphs score every row fully.
        # Tokens the checkpoint never lets it say (generation_config.json's bad words): banned in every row (read_out.py).
        # Such a model scores every row fully (a banned argmax would leave nothing).
        banned = loaded.banned_token_ids
        self.banned = to_device(banned, device, torch.long) if banned else None
        self.cheap_argmax = bool(getattr(self.model, "cheap_argmax", False)) and self.banned is None
        self.aligns = bool(getattr(self.model, "aligns", False))  # it can leave its attention for coverage penalties
        self.sampling = SamplingTable(max_num_seqs, self.vocab_size, device)
        self.grammar_masks = GrammarMasks(self.vocab_size, device)
        # Each live sequence's state slot and/or its blocks (as many as the longest sequence holds).
        self.table = CacheTable(max_num_seqs, layout.width, device)
        # The scheduler never packs more than max_num_batched_tokens into a step.
        self.buffers = InputBuffers(max_num_batched_tokens, max_num_seqs, self.table, layout, device)
        # Decode steps replayed as graphs (`capture_graphs`); none until captured, so every step runs eagerly.
        self.graphs = DecodeGraphs(self.model, self.state, self.buffers)
        self.rows: DecodeRows | None = None  # the persistent batch: the last step's plain decode rows
        self.num_reused_steps = 0  # steps launched on the step before's inputs as they were (decode_rows.py)
        self.num_delta_steps = 0  # steps that kept some of the persistent batch's rows and packed the rest

    def run(self, batch: ScheduledBatch) -> StepResult:
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, inputs_from: PendingStep | None = None) -> PendingStep:
        """Queue the step's device work and its copy back. `inputs_from`: a step still in flight whose sampled
        ids are the input tokens of this one's sequences (each a one-token decode; its token is not on the host)."""
        rows, self.rows = self.rows, None  # the persistent batch, dropped if this step fails
        self.table.apply(batch.table_edits)  # first: its host bookkeeping stays right if a device op fails
        self.layout.apply(batch.cache_ops)
        if batch.encodes:  # an encoder-decoder model's new sources: their encoder outputs, before any step reads them
            self.model.encode([list(e.source) for e in batch.encodes], [e.blocks for e in batch.encodes], self.state)
        if batch.admitted:
            self.sampling.write([g.slot for g in batch.admitted], [g.params for g in batch.admitted])
        kept, index, tail = self._keep(batch, rows, inputs_from)
        if kept is not None and index is None and not tail and rows.whole is not None:
            return self._again(batch, rows)
        masks = longest = None
        aligned = False
        if kept is not None:  # plain sampling rows only: no beams, so no coverage
            packed, logit_rows, plan, longest = self._delta(rows, index, kept, tail)
        else:
            packed, logit_rows, plan, masks = self._whole(batch, inputs_from)
            aligned = self.aligns and any(seq.group.params.follows_coverage for seq, _ in batch.work)
        pending = self._run(batch, packed, logit_rows, plan, masks, aligned=aligned)
        self.rows = DecodeRows.of(packed, logit_rows, plan, pending.sampled_ids, len(kept or ()), longest)
        return pending

    def _again(self, batch: ScheduledBatch, rows: DecodeRows) -> PendingStep:
        """The steady state, a step of exactly the persistent batch's rows: the inputs on the device are the last
        step's, one position on."""
        packed, logit_rows, plan = rows.whole.packed, rows.whole.logit_rows, rows.whole.plan
        packed.token_source = rows.sampled_ids
        packed.longest += 1
        self.buffers.splice_tokens(packed)
        self.buffers.positions[: len(packed.positions)].add_(1)
        self.num_reused_steps += 1
        pending = self._run(batch, packed, logit_rows, plan, None, in_place=True)
        self.rows = rows.moved(pending.sampled_ids)
        return pending

    def _delta(self, rows: DecodeRows, index: torch.Tensor | None, kept: list, tail: list):
        """The persistent batch's rows that stay, then the tail packed behind them, all plain sampling rows."""
        packed, logit_rows, slots, generators, longest = delta_inputs(rows, index, kept, tail, self.table.row_of)
        tail_params = [seq.group.params for seq, _ in logit_rows.sampled[len(kept):]]
        flags = rows.flags.join(RowFlags.of(tail_params, self.vocab_size)) if tail_params else rows.flags
        plain = rows.plain and not any(p.scores_samples for p in tail_params)
        plan = plan_plain(kept + [seq for seq, _ in logit_rows.sampled[len(kept):]], slots, generators, flags, plain, self.sampling,
                          self.buffers)
        self.num_delta_steps += 1
        return packed, logit_rows, plan, longest

    def _whole(self, batch: ScheduledBatch, inputs_from: PendingStep | None):
        """Every sequence of the step packed, its sampling planned, grammar masks started."""
        packed, logit_rows = pack(batch.work, self.table.row_of)
        masks = self.grammar_masks.start(logit_rows.next_token_seqs())  # filled while the model runs
        plan = plan_sampling(logit_rows, masks, self.sampling, self.buffers, self.loaded.eos_token_ids)
        if inputs_from is not None:
            packed.token_source = self._token_source(batch, inputs_from)
        return packed, logit_rows, plan, masks

    def _keep(self, batch: ScheduledBatch, rows: DecodeRows | None,
              inputs_from: PendingStep | None) -> tuple[list | None, torch.Tensor | None, list]:
        """(the sequences of the persistent batch's rows this step keeps, their row indices (None: every row), the
        work behind them), or None for the first when the step is packed whole: nothing to keep, or a tail that
        needs more than plain sampling rows or whose tokens are still on the device."""
        if rows is None:
            return None, None, batch.work
        freed = {edit.seq_id for edit in batch.table_edits if edit.is_free}
        index, kept, matched = rows.keep(batch.work, freed)
        tail = batch.work[matched:]
        if not kept or (tail and (inputs_from is not None or not plain_tail(tail))):
            return None, None, batch.work
        return kept, index, tail

    def _run(self, batch: ScheduledBatch, packed: Packed, logit_rows: LogitRows, plan: SamplingPlan | None,
             masks, in_place: bool = False, aligned: bool = False) -> PendingStep:
        """The forward pass, eager or replayed, then the read-out. `in_place`: the buffers hold the inputs already
        (and the argmax-only marks stand: a persistent row's settings never change). `aligned`: `packed` is
        `batch.work` in order, some of it summing its coverage (eager: a graph returns no alignment)."""
        size = None if aligned else self.graphs.bucket_for(packed.query_lens)
        if size is None:
            if not in_place and self.cheap_argmax:
                logit_rows.argmax_only = argmax_only(logit_rows, len(packed.rows), self.device)
            step = self.buffers.step_batch(packed, logit_rows.argmax_only, upload=not in_place)
            step.want_alignment = aligned
            logits = self.model.step(step, self.state)  # (logit rows, V)
            if aligned:
                add_coverage(batch.work, step.alignment)
        else:
            logits = self.graphs.replay(packed, size, fill=not in_place)
        return read_out(batch, logits, logit_rows, masks, plan, self.banned)

    def _token_source(self, batch: ScheduledBatch, previous: PendingStep) -> torch.Tensor:
        """(rows,) the input token of each of `batch`'s sequences, picked from the previous step's sampled ids."""
        owners = previous.sampling.owners  # a row each: a decode step overlaps only when no prompt forks
        row_of = {seq: i for i, (seq, _) in enumerate(owners)}
        rows = [row_of[seq] for seq, _ in batch.work]
        if rows == list(range(len(owners))):
            return previous.sampled_ids
        return previous.sampled_ids.index_select(0, to_device(rows, self.device, torch.long))

    def capture_graphs(self, capture: GraphCapture, sizes: list[int]) -> None:
        """Capture a decode step's graph for each batch size in `sizes` (graphs.py)."""
        self.graphs.capture(capture, sizes)
