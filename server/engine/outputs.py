"""What the engine hands back per request and step: deltas for streaming, totals at the end."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # best alternatives, most likely first


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str  # new text since the previous output of this request
    token_ids: list[int]  # new tokens since the previous output
    logprobs: list[TokenLogprob] | None = None  # one per new token, when asked for
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    cumulative_logprob: float = 0.0
    score: float | None = None  # beam search: the length-penalised score


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    num_prompt_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None  # with the first output, when asked for
    error: str | None = None
    queue_time: float | None = None  # seconds from arrival to first scheduled (first output only)


def merge_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One delta covering two consecutive ones of the same request (`earlier` is extended and returned)."""
    by_index = {c.index: c for c in earlier.outputs}
    for c in later.outputs:
        before = by_index.get(c.index)
        if before is None:
            earlier.outputs.append(c)
            continue
        before.text += c.text
        before.token_ids = before.token_ids + c.token_ids
        if c.logprobs is not None:
            before.logprobs = (before.logprobs or []) + c.logprobs
        before.finish_reason, before.cumulative_logprob, before.score = c.finish_reason, c.cumulative_logprob, c.score
    earlier.finished = later.finished
    earlier.error = earlier.error or later.error
    return earlier
