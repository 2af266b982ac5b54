"""Which sequences run in the next step, and how many of their tokens.

Iteration-level batching: requests join the running set at any step and leave the
moment they finish. Running requests are served first (decode tokens, or the next
chunk of a long prompt), then waiting requests are admitted while the per-step token
budget and the sequence cap allow. When the cache is full, the most recently admitted
request is preempted: its cache is freed and it is recomputed later from its tokens.
Plain Python: the cache is reached only through the `CacheManager` protocol, and the device
work the step needs (block copies, slot resets) travels in the batch for the runner to apply, with
the changes to sequences' block tables and slots since the last step (table_edits.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .cache.manager import CacheManager, CacheOp
from .sequence import Sequence, SequenceGroup, Status
from .cache.table_edits import TableEdit


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the API answers 429."""


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64  # live sequences in the running set (beams and samples count one each)
    max_num_batched_tokens: int = 2048  # tokens computed in one step
    max_queue: int = 256  # requests waiting to be admitted

    def __post_init__(self):
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.max_queue) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_queue must be positive")


@dataclass
class ScheduledBatch:
    work: list[tuple[Sequence, int]] = field(default_factory=list)  # sequence, number of new tokens
    cache_ops: list[CacheOp] = field(default_factory=list)  # device work to apply before the forward pass
    table_edits: list[TableEdit] = field(default_factory=list)  # block tables and slots changed since the last step
    admitted: list[SequenceGroup] = field(default_factory=list)  # took a sampling slot this step
    num_preemptions: int = 0
    failed: list[SequenceGroup] = field(default_factory=list)  # requests the cache can never hold
    encodes: list = field(default_factory=list)  # EncoderEntry: sources the encoder runs over before this step

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work)


class Scheduler:
    def __init__(self, config: SchedulerConfig, cache: CacheManager):
        self.config = config
        self.cache = cache
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.free_slots = list(range(config.max_num_seqs - 1, -1, -1))  # per-request sampling rows
        self.num_preemptions = 0
        self.encoders = getattr(cache, "encoder", None)  # an encoder-decoder model's encoder outputs

    # ---- queue -----------------------------------------------------------------

    def add(self, group: SequenceGroup) -> None:
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFullError(f"the queue is full ({self.config.max_queue} requests waiting)")
        group.status = Status.WAITING
        self.waiting.append(group)

    def remove(self, group: SequenceGroup) -> None:
        """Take a request out (finished or aborted) and free everything it holds."""
        if group in self.running:
            self.running.remove(group)
            self._release_slot(group)
        elif group in self.waiting:
            self.waiting.remove(group)
        for seq in group.seqs:
            self.cache.free(seq.seq_id)
        self._release_encoder(group)
        group.status = Status.FINISHED

    @staticmethod
    def seats(group: SequenceGroup) -> int:
        """Sequences a request may run at once, reserved from admission on: W for a beam search (beams
        fork and drop every step), n samples until they are forked, then those still running."""
        if group.params.use_beam_search or not group.is_forked:
            return group.num_outputs
        return len(group.seqs)

    @property
    def num_running_seqs(self) -> int:
        return sum(self.seats(g) for g in self.running)

    @property
    def num_reserved(self) -> int:
        """Seats taken by running requests whose samples or beams are not yet forked."""
        return sum(self.seats(g) - len(g.seqs) for g in self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step --------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        allocate, work = self.cache.allocate, batch.work
        i = 0
        while i < len(self.running) and budget > 0:
            group = self.running[i]
            seqs = group.seqs
            if len(seqs) == 1:  # the common case, kept cheap: one sequence decoding its newest token
                seq = seqs[0]
                if len(seq.token_ids) - seq.num_computed == 1 and allocate(seq.seq_id, seq.num_computed, 1):
                    work.append((seq, 1))
                    budget -= 1
                    i += 1
                    continue
            plan = self._plan(group, budget)
            if not plan:
                i += 1
                continue
            while not self._allocate(plan):
                victim = self.running[-1]
                self._preempt(victim)
                batch.num_preemptions += 1
                if victim is group:
                    if not self.running:  # alone and still does not fit: it never will
                        self.waiting.remove(group)
                        batch.failed.append(group)
                    break
            else:
                batch.work += plan
                budget -= sum(n for _, n in plan)
                i += 1
        # Admit waiting requests, oldest first (preempted ones were put back at the front).
        while self.waiting and budget > 0:
            group = self.waiting[0]
            seats = self.seats(group)
            if self.num_running_seqs + seats > self.config.max_num_seqs:
                break
            if not self.cache.can_admit(seats + self.num_reserved):
                break
            encode = 0  # source tokens the encoder runs over for it this step
            if group.encoder_token_ids is not None:
                encode = self._acquire_encoder(group, budget, bool(batch.work))
                if encode is None:
                    break
            for seq in group.seqs:
                seq.num_computed = self.cache.admit(seq.seq_id, seq.token_ids, self._max_cached(group, seq))
            plan = self._plan(group, budget - encode)
            if not plan or not self._allocate(plan):
                for seq in group.seqs:
                    self.cache.free(seq.seq_id)
                    seq.num_computed = 0
                self._release_encoder(group)
                if not self.running:  # an empty cache cannot hold it: it never will
                    self.waiting.popleft()
                    batch.failed.append(group)
                    continue
                break
            if group.encoder_entry is not None:
                self._bind_encoder(group, batch)
                budget -= encode
            self.waiting.popleft()
            group.status = Status.RUNNING
            group.slot = self.free_slots.pop()
            if group.first_scheduled_time is None:
                group.first_scheduled_time = time.monotonic()
            self.running.append(group)
            batch.admitted.append(group)
            batch.work += plan
            budget -= sum(n for _, n in plan)
        self.num_preemptions += batch.num_preemptions
        if batch.work:  # a batch with no work never reaches the runner: its changes wait for one that does
            batch.cache_ops = self.cache.take_ops()
            batch.table_edits = self.cache.table_edits.take()
        return batch

    def schedule_decode(self, live: ScheduledBatch) -> ScheduledBatch | None:
        """The step after `live`, the live part of a step still in flight (overlap.py), committed as if each of its
        sequences got its token: every running sequence decodes one more, its cache allocated here. None when that
        cannot be known before the step's tokens reach the host (anything waits, a sequence of the step is not
        plain, or the cache is full: a preemption waits for the step in flight)."""
        if self.waiting or not live.work:
            return None
        if len(live.work) != sum(len(group.seqs) for group in self.running):
            return None  # some running sequence was not in the step in flight: `schedule` decides
        cache = self.cache
        for seq, _ in live.work:
            if not seq.decodes_on_device or not cache.allocate(seq.seq_id, seq.num_computed, 1):
                return None
        return ScheduledBatch(work=[(seq, 1) for seq, _ in live.work], cache_ops=cache.take_ops(),
                              table_edits=cache.table_edits.take())

    def _acquire_encoder(self, group: SequenceGroup, budget: int, others: bool) -> int | None:
        """Take the request's encoder entry; returns the source tokens to encode this step (0: encoded before), or
        None when it must wait: no room for its encoder output, or its encoding would overrun the step's budget
        beside `others` (a step with nothing else encodes any source the model takes)."""
        entry = self.encoders.acquire(group.encoder_token_ids)
        if entry is None:
            return None
        group.encoder_entry = entry
        encode = 0 if entry.encoded else entry.length
        if encode >= budget and others:
            self._release_encoder(group)
            return None
        return encode

    def _bind_encoder(self, group: SequenceGroup, batch: ScheduledBatch) -> None:
        """The admitted request's sequences read its entry, encoded in this step if it was not before."""
        entry = group.encoder_entry
        for seq in group.seqs:
            self.encoders.bind(seq.seq_id, entry)
        if not entry.encoded:
            entry.encoded = True
            batch.encodes.append(entry)

    def _release_encoder(self, group: SequenceGroup) -> None:
        if group.encoder_entry is not None:
            self.encoders.release(group.encoder_entry)
            group.encoder_entry = None

    def _release_slot(self, group: SequenceGroup) -> None:
        self.free_slots.append(group.slot)
        group.slot = None

    def _max_cached(self, group: SequenceGroup, seq: Sequence) -> int:
        """At least the last token is recomputed (its logits are needed); scoring prompts compute everything."""
        if group.params.prompt_logprobs is not None and not group.is_forked:
            return 0
        return seq.num_tokens - 1

    def _plan(self, group: SequenceGroup, budget: int) -> list[tuple[Sequence, int]]:
        """New tokens for each of the group's sequences, sharing the budget evenly so beams stay in step."""
        seqs = [s for s in group.seqs if s.num_uncomputed > 0]
        if not seqs:
            return []
        share = budget // len(seqs)
        if share == 0:
            return []
        plan = []
        for seq in seqs:
            n = min(seq.num_uncomputed, share)
            limit = self.cache.chunk_limit(seq.seq_id, seq.num_computed, seq.num_prompt_tokens)
            plan.append((seq, n if limit is None else min(n, limit)))
        if group.params.use_beam_search and len(plan) > 1:
            # Beams choose their next tokens together: none may reach its last token before the others
            # (after a preemption their cached prefixes can differ), so the early ones keep it for later.
            ends = [n == seq.num_uncomputed for seq, n in plan]
            if any(ends) and not all(ends):
                plan = [(seq, n - end) for (seq, n), end in zip(plan, ends) if n - end > 0]
        return plan

    def _allocate(self, plan: list[tuple[Sequence, int]]) -> bool:
        return all(self.cache.allocate(seq.seq_id, seq.num_computed, n) for seq, n in plan)

    def _preempt(self, group: SequenceGroup) -> None:
        """Free the group's cache; it is recomputed from its tokens when readmitted."""
        self.running.remove(group)
        self._release_slot(group)
        for seq in group.seqs:
            self.cache.free(seq.seq_id)
            seq.num_computed = 0
        self._release_encoder(group)  # kept cached while no one needs its blocks: readmitted, it is found again
        group.status = Status.WAITING
        self.waiting.appendleft(group)

    def commit(self, batch: ScheduledBatch) -> None:
        """The step ran: its tokens are now in the cache."""
        commit = self.cache.commit
        for seq, n in batch.work:
            seq.num_computed += n
            commit(seq.seq_id, seq.token_ids, seq.num_computed, seq.num_prompt_tokens)
