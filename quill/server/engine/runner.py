"""The only part of the engine that touches tensors: one scheduled batch in, its tokens out.

A step (1) applies the cache managers' device work (block copies, slot copies and resets), and the
batch's changes to sequences' block tables or slots to its own table of them on the device
(cache_table.py), (2) packs the scheduled tokens into persistent, max-sized input buffers (one
host-to-device copy per field; each sequence's blocks or slot are gathered on the device from its row
of that table), (3) runs the model (telling a model that declares `cheap_argmax` which rows need only
their argmax: plain greedy requests), or for a decode-only step replays the CUDA graph captured for its
batch size (`capture_graphs`; graphs score every row fully), (4) on the device: samples a token for every
sequence whose tokens are now all computed, ranks the candidates of every beam request with one top-k, and
scores prompt tokens for requests that asked (constrained rows are first masked by their grammars, the
masks filled on the host while the model ran: grammar_masks.py), and (5) brings everything the host needs back in
a single device-to-host copy.

`launch` stops before the host waits for that copy: it returns a `PendingStep` whose `result()` waits.
With overlapped scheduling the engine launches the next decode step in between, its input tokens
taken on the device from this step's sampled ids (`inputs_from`), so the GPU never waits for the host.
When that step decodes the very sequences of the one before, in order (the steady state), it reuses the
host's inputs of that step: the buffers on the device already hold them but the positions, moved one on
there, so no per-sequence pass packs, uploads or gathers sampling settings (`_repeat_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from quill.models.batch import StepBatch
from quill.models.checkpoint import LoadedModel
from quill.models.host_copy import to_device
from quill.server.sampling import SamplingBatch, prompt_logprobs, sample
from quill.server.sampling.beam import BeamRequest, beam_candidates
from quill.server.sampling.table import SamplingTable

from .cache_table import CacheTable
from .cuda_graphs import GraphCapture, GraphCaptureError, Replay
from .grammar_masks import GrammarMasks, PendingMasks
from .graph_buckets import choose_bucket, pad_rows
from .outputs import TokenLogprob
from .scheduler import ScheduledBatch
from .state_kinds import StateLayout
from .sequence import Sequence, SequenceGroup


@dataclass(slots=True)
class Sampled:
    """A token chosen for a sequence: its raw log-probability, and alternatives when the request asked."""

    token_id: int
    logprob: float
    entry: TokenLogprob | None


@dataclass
class StepResult:
    # Every sampling sequence whose tokens are all computed: one token, or n when its prompt just
    # completed and the request forks into n samples (token i for output i).
    sampled: list[tuple[Sequence, list[Sampled]]] = field(default_factory=list)
    # Every beam request whose beams are all computed: candidate scores (descending), flat indices.
    beams: list[tuple[SequenceGroup, list[float], list[int]]] = field(default_factory=list)
    # Prompt tokens scored this step (echo / prompt_logprobs), in order.
    prompt_logprobs: list[tuple[Sequence, list[TokenLogprob]]] = field(default_factory=list)


class _Transfer:
    """Device tensors queued for the host, copied back together as one float64 vector."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor) -> int:
        self.parts.append(tensor)
        return len(self.parts) - 1

    def start(self) -> "_Arrival":
        """Queue the copy; on CUDA it goes into pinned memory without blocking and an event marks its end."""
        if not self.parts:
            return _Arrival(None, None, [])
        if len(self.parts) == 1:  # the common step: token ids alone
            flat = self.parts[0].reshape(-1).to(torch.float64, copy=True)
        else:
            flat = torch.cat([p.reshape(-1).to(torch.float64) for p in self.parts])
        event = None
        if flat.device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            flat = host
        return _Arrival(flat, event, [p.numel() for p in self.parts])


@dataclass(slots=True)
class _Arrival:
    """A started device-to-host copy of a step's results (on the CPU: already there)."""

    flat: torch.Tensor | None
    event: object  # torch.cuda.Event, or None where nothing is in flight
    sizes: list[int]

    def wait(self) -> list[list[float]]:
        if self.flat is None:
            return []
        if self.event is not None:
            self.event.synchronize()
        flat = self.flat.tolist()
        out, start = [], 0
        for size in self.sizes:
            out.append(flat[start : start + size])
            start += size
        return out


@dataclass
class PendingStep:
    """A launched step: its result arrives with `result()`; `sampled_ids` stay on the device for the next step."""

    batch: ScheduledBatch
    sampling: "_SamplingPlan | None"  # whom each row of `sampled_ids` samples for (None: nobody samples)
    sampled_ids: torch.Tensor | None  # (rows,) int64, the tokens chosen for its sequences
    arrival: _Arrival
    build: Callable[[list[list[float]]], StepResult]
    reusable: "_DecodeInputs | None" = None  # what the next decode step of the same sequences takes over

    def result(self) -> StepResult:
        return self.build(self.arrival.wait())


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
        max_tokens = max_num_batched_tokens  # the scheduler never packs more into a step
        self.token_ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.logits_indices = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.sample_slots = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        # Each live sequence's state slot and/or its blocks (as many as the longest sequence holds).
        self.table = CacheTable(max_num_seqs, layout.width, device)
        self.table_rows = torch.zeros(max_num_seqs, dtype=torch.long, device=device)  # the step's rows of `table`
        # Decode steps replayed as graphs (see capture_graphs); none until captured, so every step runs eagerly.
        self.graph_sizes: list[int] = []
        self.graphs: dict[int, Replay] = {}
        self.num_reused_steps = 0  # decode steps launched on the step before's inputs (`_repeat_of`)

    # ---- the step ------------------------------------------------------------------------

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
        repeat = self._repeat_of(batch, inputs_from)
        if repeat is not None:  # the inputs on the device are the last step's, one position on
            packed, logit_rows, plan = repeat.packed, repeat.logit_rows, repeat.plan
            packed.token_source = inputs_from.sampled_ids
            packed.longest += 1
            self._splice_tokens(packed)
            self.positions[: len(packed.positions)].add_(1)
            masks = None
            self.num_reused_steps += 1
        else:
            packed, logit_rows = self._pack(batch.work)
            masks = self.grammar_masks.start(logit_rows.next_token_seqs())  # filled while the model runs
            plan = self._plan_sampling(logit_rows, masks)
            if inputs_from is not None:
                packed.token_source = self._token_source(batch, inputs_from)
        size = choose_bucket(packed.query_lens, self.graph_sizes)
        if size is None:
            if repeat is None:  # a repeat's marks stand: its rows' settings never change (`_reusable`)
                logit_rows.argmax_only = self._argmax_only(logit_rows, len(packed.rows))
            step = self._step_batch(packed, logit_rows.argmax_only, upload=repeat is None)
            logits = self.model.step(step, self.state)  # (logit rows, V)
        else:
            logits = self._replay(packed, size, fill=repeat is None)
        if repeat is None and self._reusable(packed, logit_rows, plan):
            repeat = _DecodeInputs(packed, logit_rows, plan)
        return self._read_out(batch, logits, logit_rows, masks, plan, repeat)

    def _repeat_of(self, batch: ScheduledBatch, previous: PendingStep | None) -> "_DecodeInputs | None":
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

    @staticmethod
    def _reusable(packed: "_Packed", logit_rows: "_LogitRows", plan: "_SamplingPlan | None") -> bool:
        """Whether a step's host inputs serve the next step of the same sequences (`_repeat_of`): every sequence
        decodes one token and samples it with settings that do not change from step to step."""
        return (plan is not None and plan.reusable and plan.num_rows == len(plan.owners) and not logit_rows.beam_rows
                and not logit_rows.scored and len(packed.tokens) == len(packed.query_lens))

    def _token_source(self, batch: ScheduledBatch, previous: PendingStep) -> torch.Tensor:
        """(rows,) the input token of each of `batch`'s sequences, picked from the previous step's sampled ids."""
        owners = previous.sampling.owners  # a row each: a decode step overlaps only when no prompt forks
        row_of = {seq: i for i, (seq, _) in enumerate(owners)}
        rows = [row_of[seq] for seq, _ in batch.work]
        if rows == list(range(len(owners))):
            return previous.sampled_ids
        return previous.sampled_ids.index_select(0, to_device(rows, self.device))

    def _splice_tokens(self, packed: "_Packed") -> None:
        """Overwrite the placeholder input tokens with those still on the device (see `launch`)."""
        if packed.token_source is not None:
            self.token_ids[: packed.token_source.shape[0]].copy_(packed.token_source)

    # ---- CUDA graphs -----------------------------------------------------------------------

    @torch.inference_mode()
    def capture_graphs(self, capture: GraphCapture, sizes: list[int]) -> None:
        """Record a decode step for each batch size in `sizes`, largest first (see cuda_graphs.py).

        The padding rows of a bucket, and the warm-up runs before each capture, write only to the scratch block
        and slot that no cache manager ever hands out (the table's padding row points there).
        """
        self.table.fill_padding(self.layout.padding())
        for size in sorted(sizes, reverse=True):
            self._fill_bucket(_Packed(), size)  # every row is padding while capturing
            try:
                self.graphs[size] = capture.capture(partial(self._bucket_step, size))
            except RuntimeError as e:
                raise GraphCaptureError(size, e) from e
        self.graph_sizes = sorted(sizes)

    def _bucket_step(self, size: int) -> torch.Tensor:
        """The decode step a bucket's graph runs: one token per row, logits for every row, over fixed views of
        the persistent buffers; the rows' blocks (every column: the longest sequence's width) or slots are
        gathered on the device. Nothing changes between replays but the buffers' contents."""
        step = StepBatch(token_ids=self.token_ids[:size], positions=self.positions[:size], query_lens=[1] * size)
        self.layout.locate(step, self.table.gather(self.table_rows[:size], self.table.width))
        return self.model.step(step, self.state)

    def _fill_bucket(self, packed: "_Packed", size: int) -> None:
        """Write a step's inputs into its bucket's buffers; rows past the real ones are padding: token 0 at
        position 0 in the table's padding row, whose K,V or state goes to the scratch block or slot."""
        self._upload(self.token_ids, pad_rows(packed.tokens, size, 0))
        self._splice_tokens(packed)
        self._upload(self.positions, pad_rows(packed.positions, size, 0))
        self._upload(self.table_rows, pad_rows(packed.table_rows, size, self.table.padding_row))

    def _replay(self, packed: "_Packed", size: int, fill: bool = True) -> torch.Tensor:
        """The step's logit rows, from the bucket's graph; padding rows' logits are never read. `fill`: write the
        inputs into the buffers (False: they are there already)."""
        if fill:
            self._fill_bucket(packed, size)
        logits = self.graphs[size]()  # (size, V): a row per sequence
        rows = packed.rows
        if rows == list(range(len(rows))):
            return logits[: len(rows)]
        return logits.index_select(0, to_device(rows, logits.device))

    # ---- packing -----------------------------------------------------------------------------

    @staticmethod
    def _upload(buffer: torch.Tensor, values: list[int]) -> torch.Tensor:
        """One host-to-device copy into the front of a persistent buffer; returns that view."""
        view = buffer[: len(values)]
        view.copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
        return view

    def _pack(self, work: list[tuple[Sequence, int]]) -> tuple["_Packed", "_LogitRows"]:
        """The step's inputs as host lists, and which logits rows serve what."""
        logit_rows = _LogitRows()
        packed = _Packed()
        tokens, positions, rows, table_rows = packed.tokens, packed.positions, packed.rows, packed.table_rows
        row_of = self.table.row_of
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
        return packed, logit_rows

    def _argmax_only(self, logit_rows: "_LogitRows", num_rows: int) -> torch.Tensor | None:
        """(logits rows,) bool on the device: whether only a row's argmax is read (SamplingParams.needs_only_argmax);
        None when no row is, or the model gains nothing from knowing."""
        if not self.cheap_argmax:
            return None
        marks = [False] * num_rows
        for seq, row in logit_rows.sampled:
            marks[row] = seq.group.params.needs_only_argmax(seq.num_output_tokens)
        return to_device(marks, self.device, torch.bool) if any(marks) else None

    def _step_batch(self, packed: "_Packed", argmax_only: torch.Tensor | None = None, upload: bool = True) -> StepBatch:
        """An eager step's input: the fronts of the persistent buffers, block tables as wide as the longest
        sequence of the step needs. `upload`: copy `packed` into the buffers (False: they hold it already)."""
        put = self._upload if upload else lambda buffer, values: buffer[: len(values)]
        token_ids = put(self.token_ids, packed.tokens)
        if upload:
            self._splice_tokens(packed)
        step = StepBatch(
            token_ids=token_ids,
            positions=put(self.positions, packed.positions),
            query_lens=packed.query_lens,
            logits_indices=put(self.logits_indices, packed.rows),
            argmax_only=argmax_only,
        )
        rows = put(self.table_rows, packed.table_rows)
        self.layout.locate(step, self.table.gather(rows, self.layout.columns(packed.longest)))
        return step

    def _read_out(self, batch: ScheduledBatch, logits: torch.Tensor, logit_rows: "_LogitRows",
                  masks: PendingMasks | None, plan: "_SamplingPlan | None",
                  reusable: "_DecodeInputs | None") -> PendingStep:
        transfer = _Transfer()
        sampled = self._sample(logits, plan, transfer)
        beams = self._rank_beams(logits, logit_rows, transfer, masks)
        scored = self._score_prompts(logits, logit_rows, transfer)
        arrival = transfer.start()  # the step's one device-to-host copy
        ids = transfer.parts[0] if logit_rows.sampled else None  # `_sample` queues its token ids first
        return PendingStep(batch, plan, ids, arrival,
                           lambda host: StepResult(sampled(host), beams(host), scored(host)), reusable)

    # ---- sampling ------------------------------------------------------------------------

    def _plan_sampling(self, logit_rows: "_LogitRows", masks: PendingMasks | None) -> "_SamplingPlan | None":
        """The host's half of sampling: which logits rows sample for whom, and the sampler's settings gathered on
        the device; None when no sequence samples this step."""
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
        sbatch = self.sampling.gather(
            self._upload(self.sample_slots, slots), params, generators, prompt_ids, output_ids,
            self.loaded.eos_token_ids, allowed,
        )
        picked = None if rows == list(range(len(rows))) else to_device(rows, self.device)  # None: rows 0, 1, ...
        # Settings that change from step to step (penalties, min_tokens bans, grammar masks) cannot be reused.
        plain = len(rows) == len(owners) and not any(p.scores_samples for p in params)  # no scores, no logprobs
        return _SamplingPlan(len(rows), picked, sbatch, owners,
                             reusable=not needs_tokens and allowed is None, plain=plain)

    def _sample(self, logits: torch.Tensor, plan: "_SamplingPlan | None", transfer: _Transfer):
        if plan is None:
            return lambda host: []
        if plan.picked is not None:
            logits = logits.index_select(0, plan.picked)
        elif logits.shape[0] != plan.num_rows:
            logits = logits[: plan.num_rows]
        owners = plan.owners
        # An argmax-only row's log-probability is wrong (its one finite score normalizes to 0), and never read:
        # such a row's request does not score its samples (SamplingParams.needs_only_argmax).
        out = sample(logits, plan.batch)
        ids = transfer.add(out.token_ids)
        lps = None if out.logprobs is None else transfer.add(out.logprobs)
        tops = None
        if out.top_ids is not None:
            tops = (transfer.add(out.top_ids), transfer.add(out.top_logprobs), out.top_ids.shape[1])

        if plan.plain:
            return lambda host: [(seq, [Sampled(int(token), 0.0, None)]) for (seq, _), token in zip(owners, host[ids])]

        def result(host: list[list[float]]) -> list[tuple[Sequence, list[Sampled]]]:
            token_ids = host[ids]
            logprobs = host[lps] if lps is not None else [0.0] * len(token_ids)
            results, r = [], 0
            for seq, count in owners:
                params = seq.group.params
                want = params.logprobs
                # A request that does not score its samples takes 0.0 even when a row beside it made the sampler
                # score every row: its cumulative_logprob must not depend on what shared its steps.
                scores = params.scores_samples
                chosen = []
                for _ in range(count):
                    token, lp = int(token_ids[r]), logprobs[r] if scores else 0.0
                    entry = None
                    if want is not None:
                        top = []
                        if tops is not None and want:
                            top_ids, top_lps, width = host[tops[0]], host[tops[1]], tops[2]
                            base = r * width
                            top = [(int(top_ids[base + j]), top_lps[base + j]) for j in range(min(want, width))]
                        entry = TokenLogprob(token, lp, top)
                    chosen.append(Sampled(token, lp, entry))
                    r += 1
                results.append((seq, chosen))
            return results

        return result

    def _rank_beams(self, logits: torch.Tensor, logit_rows: "_LogitRows", transfer: _Transfer,
                    masks: PendingMasks | None):
        requests, groups = [], []
        for group, rows_of in logit_rows.beam_rows.items():
            if len(rows_of) != len(group.seqs):
                raise RuntimeError(f"beam request {group.request_id}: only some beams were computed this step")
            beam = group.beam
            requests.append(BeamRequest(
                rows=[rows_of[s] for s in group.seqs], scores=list(beam.scores), num_candidates=beam.num_candidates,
                banned=beam.banned_next(group.seqs[0].num_output_tokens),
            ))
            groups.append(group)
        if not requests:
            return lambda host: []
        allowed = None if masks is None else masks.allowed([seq for group in groups for seq in group.seqs])
        values, indices = beam_candidates(logits, requests, allowed)
        v, i, width = transfer.add(values), transfer.add(indices), values.shape[1]

        def result(host: list[list[float]]):
            out = []
            for g, (group, request) in enumerate(zip(groups, requests)):
                k = min(request.num_candidates, width)
                out.append((group, host[v][g * width : g * width + k], [int(x) for x in host[i][g * width : g * width + k]]))
            return out

        return result

    def _score_prompts(self, logits: torch.Tensor, logit_rows: "_LogitRows", transfer: _Transfer):
        if not logit_rows.scored:
            return lambda host: []
        queued = []
        for seq, first_row, first_pos, count in logit_rows.scored:
            scored = prompt_logprobs(logits[first_row : first_row + count],
                                     seq.token_ids[first_pos : first_pos + count + 1], seq.group.params.prompt_logprobs)
            top = None
            if scored.top_ids is not None:
                top = (transfer.add(scored.top_ids), transfer.add(scored.top_logprobs), scored.top_ids.shape[1])
            queued.append((seq, first_pos, count, transfer.add(scored.logprobs), top))

        def result(host: list[list[float]]):
            out = []
            for seq, first_pos, count, chosen, top in queued:
                entries = []
                for j in range(count):
                    alternatives = []
                    if top is not None:
                        ids, values, width = host[top[0]], host[top[1]], top[2]
                        alternatives = [(int(ids[j * width + c]), values[j * width + c]) for c in range(width)]
                    entries.append(TokenLogprob(seq.token_ids[first_pos + 1 + j], host[chosen][j], alternatives))
                out.append((seq, entries))
            return out

        return result


@dataclass
class _Packed:
    """A step's new tokens, packed back to back, as host lists."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # packed token index of each logits row
    table_rows: list[int] = field(default_factory=list)  # per sequence: its row of the runner's cache table
    query_lens: list[int] = field(default_factory=list)
    longest: int = 0  # tokens of the step's longest sequence, counting its new ones
    token_source: torch.Tensor | None = None  # (rows,) input tokens already on the device (see `launch`)


@dataclass(slots=True)
class _SamplingPlan:
    """A step's sampling, as far as the host decides it (see `_plan_sampling`)."""

    num_rows: int  # sampler rows: one per sequence, n for a prompt that forks into n samples
    picked: torch.Tensor | None  # (num_rows,) the logits row of each sampler row; None: rows 0, 1, ... in order
    batch: SamplingBatch  # the sampler's settings, gathered on the device
    owners: list[tuple[Sequence, int]]  # each sampling sequence (`_LogitRows.sampled`'s order), its sampler rows
    reusable: bool  # nothing in it depends on this step's tokens
    plain: bool  # one token per sequence, and none asks for log-probabilities or scores its samples


@dataclass(slots=True)
class _DecodeInputs:
    """A decode step's host inputs, which the next step of the same sequences reuses (ModelRunner._repeat_of)."""

    packed: "_Packed"
    logit_rows: "_LogitRows"
    plan: _SamplingPlan


@dataclass
class _LogitRows:
    """Which logits rows of the step serve what."""

    sampled: list[tuple[Sequence, int]] = field(default_factory=list)  # sequence, its next-token row
    beam_rows: dict[SequenceGroup, dict[Sequence, int]] = field(default_factory=dict)
    scored: list[tuple[Sequence, int, int, int]] = field(default_factory=list)  # seq, first row, first pos, count
    argmax_only: torch.Tensor | None = None  # (rows,) bool: only its argmax was scored (StepBatch.argmax_only)

    def next_token_seqs(self) -> list[Sequence]:
        """Every sequence that picks its next token this step (sampled or as a beam)."""
        return [seq for seq, _ in self.sampled] + [seq for rows_of in self.beam_rows.values() for seq in rows_of]
