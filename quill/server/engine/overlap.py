"""Overlapped scheduling: which steps may run while the host still waits for the step before them.

With `EngineConfig.async_scheduling` the engine launches step N+1 before it commits step N's tokens,
so the device never idles while the host detokenizes, checks stop rules and schedules. Step N+1 is
scheduled assuming every running sequence gets one more token, and its input tokens are step N's
sampled ids, still on the device. That holds only in the steady state of decoding, so only there does
a step overlap: every sequence decodes one token of a sampling request whose next step needs nothing
of the host's but its cache (no prompt chunk, no fork into n samples, no beam search, no prompt
logprobs, no penalties or min_tokens, which read the output ids on the host, no grammar, whose next mask
needs the token on the host), every running sequence
takes part, nothing waits to be admitted and the cache has room without preempting; the scheduler decides
that and allocates the step's cache, as for any step (`Scheduler.schedule_decode`). Anything else waits for
the step in flight and is scheduled as a synchronous step.

A sequence that finishes (or is aborted) at step N has already computed a token in step N+1: that
token is dropped, never committed nor emitted, and the sequence's cache was freed with step N.
"""

from __future__ import annotations

from .scheduler import ScheduledBatch


def can_overlap(batch: ScheduledBatch) -> bool:
    """Whether the next step may be launched while this one is still in flight."""
    return bool(batch.work) and not batch.failed and all(
        n == 1 and seq.num_uncomputed == 1 and seq.decodes_on_device for seq, n in batch.work
    )


def live_work(batch: ScheduledBatch) -> ScheduledBatch:
    """The batch without the sequences that finished or were aborted since it was scheduled."""
    return ScheduledBatch(work=[(seq, n) for seq, n in batch.work if seq.is_live])
