"""The engine step for one model: schedule -> run -> update.

Synchronous and single-threaded on purpose: `AsyncEngine` runs it on a thread of its
own and feeds it requests and aborts between steps.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from models.checkpoint import LoadedModel
from models.tokenizer import IncrementalDecoder
from server.sampling import SamplingBatch, SamplingParams, StopChecker, new_generator, prompt_logprobs, sample

from .beam_search import BeamSearch
from .kv_blocks import KVBlockManager
from .outputs import CompletionOutput, RequestOutput, TokenLogprob
from .runner import ModelRunner
from .scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from .sequence import Sequence, SequenceGroup
from .state_slots import StateSlotManager


@dataclass
class CacheConfig:
    block_size: int = 16  # tokens per K,V block, and the prefix-snapshot interval of fixed-size states
    cache_bytes: int = 256 * 2**20  # K,V cache reserved up front (Transformers)
    num_blocks: int | None = None  # overrides cache_bytes
    snapshots_per_seq: int = 2  # spare state slots per sequence slot for prefix snapshots (LSTM, GCNN)
    enable_prefix_caching: bool = True

    def __post_init__(self):
        if self.block_size < 1 or self.cache_bytes < 1 or (self.num_blocks is not None and self.num_blocks < 1):
            raise ValueError("block_size, cache_bytes and num_blocks must be positive")


@dataclass
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)


@dataclass
class StepStats:
    num_seqs: int = 0
    num_tokens: int = 0
    num_preemptions: int = 0


class EngineCore:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None):
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.model.config.vocab_size
        model, cache_cfg = loaded.model, self.config.cache
        if model.state_kind == "paged_kv":
            probe = model.new_state(1, block_size=cache_cfg.block_size)
            num_blocks = cache_cfg.num_blocks or max(1, cache_cfg.cache_bytes // probe.bytes_per_block)
            self.state = model.new_state(num_blocks, block_size=cache_cfg.block_size)
            self.cache = KVBlockManager(
                num_blocks, cache_cfg.block_size, self.state.copy_blocks, cache_cfg.enable_prefix_caching
            )
        else:
            seq_slots = self.config.scheduler.max_num_seqs
            self.state = model.new_state(seq_slots * (1 + cache_cfg.snapshots_per_seq))
            self.cache = StateSlotManager(self.state, seq_slots, cache_cfg.block_size, cache_cfg.enable_prefix_caching)
        self.scheduler = Scheduler(self.config.scheduler, self.cache)
        self.runner = ModelRunner(loaded, self.state, self.cache)
        self.groups: dict[str, SequenceGroup] = {}
        self._seq_ids = itertools.count()
        self.last_step = StepStats()

    # ---- requests ----------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        s = self.state
        return s.bytes_per_block * s.num_blocks if hasattr(s, "bytes_per_block") else s.bytes_per_slot * s.num_slots

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raises QueueFullError when the waiting queue is at its bound."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt has no tokens")
        seq = self._new_sequence(list(prompt_token_ids), len(prompt_token_ids), 0, params)
        group = SequenceGroup(request_id, list(prompt_token_ids), params, [seq])
        self.scheduler.add(group)
        self.groups[request_id] = group

    def abort(self, request_id: str) -> bool:
        group = self.groups.pop(request_id, None)
        if group is None:
            return False
        self.scheduler.remove(group)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def _new_sequence(self, token_ids, num_prompt_tokens, index, params: SamplingParams) -> Sequence:
        generator = None
        if params.seed is not None:  # each output of a seeded request has its own stream
            generator = new_generator(params.seed + index, self.loaded.device)
        seq = Sequence(next(self._seq_ids), token_ids, num_prompt_tokens, index=index, generator=generator)
        seq.decoder = IncrementalDecoder(self.tokenizer, token_ids[:num_prompt_tokens], params.skip_special_tokens)
        seq.stop = StopChecker(params, self.loaded.eos_token_ids)
        return seq

    # ---- one step ----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        outputs = [self._fail(g, "the request needs more cache than the server reserved") for g in batch.failed]
        self.last_step = StepStats(len(batch.work), batch.num_tokens, batch.num_preemptions)
        if not batch.work:
            return outputs
        now = time.monotonic()
        touched: dict[str, SequenceGroup] = {}
        seq_group: dict[int, SequenceGroup] = {}
        for group in self.scheduler.running:
            for seq in group.seqs:
                seq_group[seq.seq_id] = group
        score_ids = set()
        for seq, _ in batch.work:
            group = seq_group[seq.seq_id]
            touched[group.request_id] = group
            if group.first_scheduled_time is None:
                group.first_scheduled_time = now
            if group.params.prompt_logprobs is not None and not group.is_forked:
                score_ids.add(seq.seq_id)
        result = self.runner.forward(batch.work, score_ids)
        self._record_prompt_logprobs(batch, result, seq_group)
        self.scheduler.commit(batch)
        row_of = dict(result.last_row)  # seq_id -> its next-token logits row in this step
        for seq_id, row in result.last_row.items():
            for seq in seq_group[seq_id].seqs:
                if seq.seq_id == seq_id:
                    seq.logits = result.logits[row]
        for group in touched.values():
            if not group.is_forked and group.seqs[0].logits is not None:
                self._fork(group)
                for child in group.seqs[1:]:  # samples of one prompt share its logits row
                    row_of[child.seq_id] = row_of[group.seqs[0].seq_id]
        self._sample([g for g in touched.values() if not g.params.use_beam_search], result.logits, row_of)
        for group in touched.values():
            if group.params.use_beam_search and all(s.logits is not None for s in group.seqs):
                self._beam_step(group)
        for group in touched.values():
            out = self._collect(group)
            if out is not None:
                outputs.append(out)
        return outputs

    def _record_prompt_logprobs(self, batch: ScheduledBatch, result, seq_group) -> None:
        for seq, n in batch.work:
            if seq.seq_id not in result.prompt_rows:
                continue
            group = seq_group[seq.seq_id]
            first_row, first_pos = result.prompt_rows[seq.seq_id]
            if group.prompt_logprobs is None:
                group.prompt_logprobs = [None]  # the first token has no context
            # Row j predicts token first_pos + j + 1; keep those inside the prompt.
            count = min(n, seq.num_prompt_tokens - 1 - first_pos)
            if count <= 0:
                continue
            scored = prompt_logprobs(
                result.logits[first_row : first_row + count],
                seq.token_ids[first_pos : first_pos + count + 1],
                group.params.prompt_logprobs,
            )
            group.prompt_logprobs += _token_logprobs(
                seq.token_ids[first_pos + 1 : first_pos + count + 1], scored.logprobs, scored.top_ids, scored.top_logprobs
            )

    def _fork(self, group: SequenceGroup) -> None:
        """The prompt is computed: split it into the request's n samples (beams fork as they are chosen)."""
        group.is_forked = True
        group.first_token_time = time.monotonic()
        params = group.params
        if params.use_beam_search:
            group.beam = BeamSearch(
                width=params.beam_width, max_tokens=params.max_tokens,
                eos_token_ids=[] if params.ignore_eos else list(self.loaded.eos_token_ids),
                length_penalty=params.length_penalty, early_stopping=params.early_stopping,
                min_tokens=params.min_tokens,
            )
            return
        parent = group.seqs[0]
        for index in range(1, params.n):
            child = self._new_sequence(list(parent.token_ids), parent.num_prompt_tokens, index, params)
            child.num_computed = parent.num_computed
            child.logits = parent.logits
            self.cache.fork(parent.seq_id, child.seq_id)
            group.seqs.append(child)

    def _sample(self, groups: list[SequenceGroup], step_logits: torch.Tensor, row_of: dict[int, int]) -> None:
        """One token for every sampling sequence computed this step, all rows in one batched call."""
        seqs = [(g, s) for g in groups for s in g.seqs if s.logits is not None]
        if not seqs:
            return
        rows = torch.tensor([row_of[s.seq_id] for _, s in seqs], device=step_logits.device)
        logits = step_logits.index_select(0, rows)
        sbatch = SamplingBatch.build(
            params=[g.params for g, _ in seqs],
            prompt_ids=[s.token_ids[: s.num_prompt_tokens] for _, s in seqs],
            output_ids=[s.output_token_ids for _, s in seqs],
            generators=[s.generator for _, s in seqs],
            vocab_size=self.vocab_size,
            device=logits.device,
            eos_token_ids=self.loaded.eos_token_ids,
        )
        out = sample(logits, sbatch)
        token_ids = out.token_ids.tolist()
        entries = _token_logprobs(token_ids, out.logprobs, out.top_ids, out.top_logprobs)
        for row, (group, seq) in enumerate(seqs):
            seq.logits = None
            want = group.params.logprobs
            entry = None
            if want is not None:
                entry = entries[row]
                entry.top = entry.top[:want]
            self._append(seq, token_ids[row], entries[row].logprob, entry)

    def _append(self, seq: Sequence, token: int, logprob: float, entry: TokenLogprob | None) -> None:
        seq.token_ids.append(token)
        seq.cumulative_logprob += logprob
        if entry is not None:
            seq.output_logprobs.append(entry)
        seq.text += seq.decoder.push(token)
        decision = seq.stop.check(token, seq.text, seq.num_output_tokens)
        if decision.finished:
            if decision.trim:  # the stop string (or stop token's text) is not part of the output
                seq.text = seq.text[: len(seq.text) - decision.trim]
            elif decision.finish_reason == "length":  # a character cut in half by the limit still counts
                seq.text += seq.decoder.flush()
            seq.finish_reason = decision.finish_reason

    def _beam_step(self, group: SequenceGroup) -> None:
        beam: BeamSearch = group.beam
        logprobs = torch.log_softmax(torch.stack([s.logits for s in group.seqs]).float(), dim=-1)
        for s in group.seqs:
            s.logits = None
        outputs = [s.output_token_ids for s in group.seqs]
        step = beam.step(logprobs, outputs)
        old = group.seqs
        # Free the beams nobody continues first, so their slots serve this step's forks.
        chosen = {parent_index for parent_index, _, _ in step.running}
        for i, seq in enumerate(old):
            if i not in chosen:
                self.cache.free(seq.seq_id)
        new: list[Sequence] = []
        reused: set[int] = set()
        for parent_index, _, _ in step.running:
            parent = old[parent_index]
            if parent_index in reused:  # a second child of the same parent: fork before anyone appends
                child = self._new_sequence(list(parent.token_ids), parent.num_prompt_tokens, len(new), group.params)
                child.num_computed = parent.num_computed
                self.cache.fork(parent.seq_id, child.seq_id)
            else:
                reused.add(parent_index)
                child = parent
            new.append(child)
        for child, (_, token, score) in zip(new, step.running):
            child.token_ids.append(token)
            child.cumulative_logprob = score
        group.seqs = new
        if step.done:
            for seq in group.seqs:
                self.cache.free(seq.seq_id)
            group.seqs = []

    # ---- outputs -----------------------------------------------------------------

    def _collect(self, group: SequenceGroup) -> RequestOutput | None:
        """Deltas for the request's client; frees what finished."""
        params = group.params
        if params.use_beam_search:
            if group.seqs or group.beam is None:
                return None  # beam search answers once, at the end
            outs = []
            eos = set(self.loaded.eos_token_ids)
            for i, hyp in enumerate(group.beam.finished[: params.n]):
                ids = hyp.token_ids
                text_ids = ids[:-1] if ids and ids[-1] in eos and not params.ignore_eos else ids
                finish = "stop" if len(text_ids) < len(ids) else "length"
                outs.append(CompletionOutput(i, self.tokenizer.decode_continuation(group.prompt_token_ids, text_ids, params.skip_special_tokens), ids, None, finish, hyp.sum_logprob, hyp.score))
            return self._finish(group, outs)
        outs = []
        for seq in list(group.seqs):
            delta_ids = seq.output_token_ids[seq.num_sent_tokens :]
            upto = len(seq.text) if seq.is_finished else len(seq.text) - seq.stop.hold_back(seq.text)
            delta_text = seq.text[seq.num_sent_chars : upto] if upto > seq.num_sent_chars else ""
            logprobs = seq.output_logprobs[seq.num_sent_tokens :] if params.logprobs is not None else None
            if delta_ids or delta_text or seq.is_finished:
                outs.append(
                    CompletionOutput(seq.index, delta_text, delta_ids, logprobs, seq.finish_reason, seq.cumulative_logprob)
                )
            seq.num_sent_tokens = seq.num_output_tokens
            seq.num_sent_chars = max(seq.num_sent_chars, upto)
            if seq.is_finished:
                group.seqs.remove(seq)
                group.finished_seqs.append(seq)
                self.cache.free(seq.seq_id)
        if not group.seqs:
            return self._finish(group, outs)
        if not outs:
            return None
        return self._output(group, outs, finished=False)

    def _output(self, group: SequenceGroup, outs, finished: bool, error: str | None = None) -> RequestOutput:
        first = not group.has_output
        out = RequestOutput(
            group.request_id, outs, finished, len(group.prompt_token_ids),
            num_generated_tokens=sum(s.num_output_tokens for s in group.seqs + group.finished_seqs),
            prompt_logprobs=group.prompt_logprobs if first else None,
            error=error,
            queue_time=group.first_scheduled_time - group.arrival_time if first and group.first_scheduled_time else None,
        )
        group.has_output = True
        return out

    def _finish(self, group: SequenceGroup, outs) -> RequestOutput:
        self.groups.pop(group.request_id, None)
        self.scheduler.remove(group)
        return self._output(group, outs, finished=True)

    def _fail(self, group: SequenceGroup, message: str) -> RequestOutput:
        self.groups.pop(group.request_id, None)
        self.scheduler.remove(group)
        group.error = message
        outs = [CompletionOutput(i, "", [], None, "error") for i in range(group.params.n)]
        return self._output(group, outs, finished=True, error=message)


def _token_logprobs(token_ids: list[int], logprobs, top_ids, top_logprobs) -> list[TokenLogprob]:
    """Rows of sampler tensors -> one TokenLogprob per token."""
    chosen = logprobs.tolist()
    if top_ids is None:
        return [TokenLogprob(t, lp) for t, lp in zip(token_ids, chosen)]
    tops = [list(zip(ids, lps)) for ids, lps in zip(top_ids.tolist(), top_logprobs.tolist())]
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(token_ids, chosen, tops)]
