"""The model runner: one scheduled batch in, its tokens out (the package's docstring says how a step goes)."""

from __future__ import annotations

import torch

from quill.models.checkpoint import LoadedModel
from quill.models.host_copy import to_device
from quill.server.sampling.table import SamplingTable

from ..cache_table import CacheTable
from ..cuda_graphs import GraphCapture
from ..grammar_masks import GrammarMasks
from ..scheduler import ScheduledBatch
from ..state_kinds import StateLayout
from .graphs import DecodeGraphs
from .inputs import InputBuffers, pack
from .read_out import PendingStep, StepResult, read_out
from .sampling_plan import DecodeInputs, argmax_only, plan_sampling


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
        self.cheap_argmax = bool(getattr(self.model, "cheap_argmax", False))
        self.sampling = SamplingTable(max_num_seqs, self.vocab_size, device)
        self.grammar_masks = GrammarMasks(self.vocab_size, device)
        # Each live sequence's state slot and/or its blocks (as many as the longest sequence holds).
        self.table = CacheTable(max_num_seqs, layout.width, device)
        # The scheduler never packs more than max_num_batched_tokens into a step.
        self.buffers = InputBuffers(max_num_batched_tokens, max_num_seqs, self.table, layout, device)
        # Decode steps replayed as graphs (`capture_graphs`); none until captured, so every step runs eagerly.
        self.graphs = DecodeGraphs(self.model, self.state, self.buffers)
        self.num_reused_steps = 0  # decode steps launched on the step before's inputs (`_repeat_of`)

    def run(self, batch: ScheduledBatch) -> StepResult:
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, inputs_from: PendingStep | None = None) -> PendingStep:
        """Queue the step's device work and its copy back. `inputs_from`: a step still in flight whose sampled
        ids are the input tokens of this one's sequences (each a one-token decode; its token is not on the host)."""
        self.table.apply(batch.table_edits)  # first: its host bookkeeping stays right if a device op fails
        self.layout.apply(batch.cache_ops)
        if batch.admitted:
            self.sampling.write([g.slot for g in batch.admitted], [g.params for g in batch.admitted])
        buffers = self.buffers
        repeat = self._repeat_of(batch, inputs_from)
        if repeat is not None:  # the inputs on the device are the last step's, one position on
            packed, logit_rows, plan = repeat.packed, repeat.logit_rows, repeat.plan
            packed.token_source = inputs_from.sampled_ids
            packed.longest += 1
            buffers.splice_tokens(packed)
            buffers.positions[: len(packed.positions)].add_(1)
            masks = None
            self.num_reused_steps += 1
        else:
            packed, logit_rows = pack(batch.work, self.table.row_of)
            masks = self.grammar_masks.start(logit_rows.next_token_seqs())  # filled while the model runs
            plan = plan_sampling(logit_rows, masks, self.sampling, buffers, self.loaded.eos_token_ids)
            if inputs_from is not None:
                packed.token_source = self._token_source(batch, inputs_from)
        size = self.graphs.bucket_for(packed.query_lens)
        if size is None:
            if repeat is None and self.cheap_argmax:  # a repeat's marks stand: its rows' settings never change
                logit_rows.argmax_only = argmax_only(logit_rows, len(packed.rows), self.device)
            step = buffers.step_batch(packed, logit_rows.argmax_only, upload=repeat is None)
            logits = self.model.step(step, self.state)  # (logit rows, V)
        else:
            logits = self.graphs.replay(packed, size, fill=repeat is None)
        if repeat is None:
            repeat = DecodeInputs.of(packed, logit_rows, plan)
        return read_out(batch, logits, logit_rows, masks, plan, repeat)

    def _repeat_of(self, batch: ScheduledBatch, previous: PendingStep | None) -> DecodeInputs | None:
        """The host inputs of `previous` when `batch` decodes exactly its sequences again, in the same order: then
        only the input tokens (the sampled ids, already on the device) and the positions (one on) change, and the
        step skips packing, uploading and gathering its sampling settings, a pass over every sequence each."""
        if previous is None or previous.reusable is None:
            return None
        before = previous.batch.work
        if len(batch.work) != len(before) or batch.admitted or not all(
            a is b for (a, _), (b, _) in zip(batch.work, before)
        ):
            return None
        return previous.reusable

    def _token_source(self, batch: ScheduledBatch, previous: PendingStep) -> torch.Tensor:
        """(rows,) the input token of each of `batch`'s sequences, picked from the previous step's sampled ids."""
        owners = previous.sampling.owners  # a row each: a decode step overlaps only when no prompt forks
        row_of = {seq: i for i, (seq, _) in enumerate(owners)}
        rows = [row_of[seq] for seq, _ in batch.work]
        if rows == list(range(len(owners))):
            return previous.sampled_ids
        return previous.sampled_ids.index_select(0, to_device(rows, self.device))

    def capture_graphs(self, capture: GraphCapture, sizes: list[int]) -> None:
        """Capture a decode step's graph for each batch size in `sizes` (graphs.py)."""
        self.graphs.capture(capture, sizes)
