"""Overlapped scheduling: which steps may run while the host still waits for the step before them.

With `EngineConfig.async_scheduling` the engine launches step N+1 before it commits step N's tokens,
so the device never idles while the host detokenizes, checks stop rules and schedules. Step N+1 is
scheduled assuming every running sequence gets one more token, and its input tokens are step N's
sampled ids, still on the device. That holds only in the steady state of decoding, so only there does
a step overlap: every sequence decodes one token of a sampling request whose next step needs nothing
of the host's but its cache (no prompt chunk, no fork into n samples, no beam search, no prompt
logprobs, no penalties or min_tokens, which read the output ids on the host, no grammar, whose next mask
needs the token on the host), every running sequence
takes part, nothing waits to be admitted and the cache has room without preempting. Anything else
waits for the step in flight and is scheduled as a synchronous step.

A sequence that finishes (or is aborted) at step N has already computed a token in step N+1: that
token is dropped, never committed nor emitted, and the sequence's cache was freed with step N.
"""

from __future__ import annotations

from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence


def is_live(seq: Sequence) -> bool:
    """Neither finished nor aborted since it was scheduled."""
    return seq.finish_reason is None and not seq.group.is_finished


def decodes_on_device(seq: Sequence) -> bool:
    """Its next step needs only the token it samples now, which can stay on the device."""
    group = seq.group
    params = group.params
    return (group.is_forked and not params.use_beam_search and not params.has_penalties and params.min_tokens == 0
            and params.structured is None)  # a grammar's next mask needs this token on the host


def can_overlap(batch: ScheduledBatch) -> bool:
    """Whether the next step may be launched while this one is still in flight."""
    return bool(batch.work) and not batch.failed and all(
        n == 1 and seq.num_uncomputed == 1 and decodes_on_device(seq) for seq, n in batch.work
    )


def live_work(batch: ScheduledBatch) -> ScheduledBatch:
    """The batch without the sequences that finished or were aborted since it was scheduled."""
    return ScheduledBatch(work=[(seq, n) for seq, n in batch.work if is_live(seq)])


def next_decode(scheduler: Scheduler, live: ScheduledBatch) -> ScheduledBatch | None:
    """The step after `live` (the live part of the step in flight, committed as if each sequence got its
    token), or None when it cannot be known before that step's tokens reach the host."""
    if scheduler.waiting or not live.work:
        return None
    if len(live.work) != sum(len(group.seqs) for group in scheduler.running):
        return None  # some running sequence was not in the step in flight: the scheduler decides
    cache = scheduler.cache
    for seq, _ in live.work:
        if not decodes_on_device(seq) or not cache.allocate(seq.seq_id, seq.num_computed, 1):
            return None  # a full cache preempts, and that waits for the step in flight
    return ScheduledBatch(work=[(seq, 1) for seq, _ in live.work], cache_ops=cache.take_ops(),
                          table_edits=cache.table_edits.take())
