"""Requests and the sequences they generate, as the scheduler and engine see them.

A request (`SequenceGroup`) starts as one sequence holding the prompt. When the prompt
is computed it forks into n samples or a beam of width W, which share the prompt's
cache. Invariant between steps: `token_ids[:num_computed]` are in the cache and every
live sequence has at most one more token waiting to be computed.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    group: "SequenceGroup"
    token_ids: list[int]
    num_prompt_tokens: int
    index: int = 0  # which of the request's outputs this is
    num_computed: int = 0
    cumulative_logprob: float = 0.0  # see CompletionOutput.cumulative_logprob
    finish_reason: str | None = None
    text: str = ""  # output text so far (stop strings already cut)
    num_sent_chars: int = 0  # how much of `text` has been streamed
    num_sent_tokens: int = 0  # how many output tokens have been streamed
    output_logprobs: list = field(default_factory=list)  # one entry per output token when asked
    decoder: object = None  # IncrementalDecoder, created by the engine
    stop: object = None  # StopChecker, created by the engine
    grammar: object = None  # GrammarMatcher of a constrained request (quill/server/structured), at this sequence's place
    # a beam of a request with a coverage penalty: each source token's attention summed over the positions computed
    # (a device tensor, replaced, never changed in place: forks share it)
    coverage: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_live(self) -> bool:
        """Neither finished nor aborted."""
        return self.finish_reason is None and not self.group.is_finished

    @property
    def decodes_on_device(self) -> bool:
        """Its next step needs only the token it samples now, which can stay on the device (overlap.py): no beams,
        no penalties or min_tokens (they read the output ids on the host), no grammar or bans by history (its next
        mask needs this token on the host)."""
        group = self.group
        params = group.params
        return (group.is_forked and not params.use_beam_search and not params.has_penalties
                and params.min_tokens == 0 and params.structured is None and not params.bans_by_history)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class SequenceGroup:
    """One request: its prompt, settings and every sequence it has generated."""

    request_id: str
    prompt_token_ids: list[int]
    params: object  # SamplingParams
    seqs: list[Sequence] = field(default_factory=list)  # live sequences, in output order
    generators: list[torch.Generator | None] = field(default_factory=list)  # output i draws from generators[i]
    arrival_time: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    slot: int | None = None  # row of the runner's per-request sampling settings, while running
    first_scheduled_time: float | None = None
    finished_seqs: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list | None = None  # filled when the request asked for them (echo/scoring)
    beam: object = None  # BeamSearch state for beam requests
    is_forked: bool = False  # the prompt sequence has been split into its n samples / W beams
    has_output: bool = False  # the first output (with prompt logprobs, queue time) has gone out
    encoder_token_ids: list[int] | None = None  # an encoder-decoder model's source; the prompt is the decoder's
    encoder_entry: object = None  # its encoder output in the cache (EncoderEntry), while admitted

    @property
    def num_outputs(self) -> int:
        """Sequences this request returns (n), or beams it keeps (W)."""
        p = self.params
        return p.beam_width if p.use_beam_search else p.n

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
