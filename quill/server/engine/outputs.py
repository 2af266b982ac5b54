"""What the engine hands back per request and step: deltas for streaming, totals at the end.

msgspec Structs rather than dataclasses: the engine process sends them up its pipe as they are
(messages.py), encoded as compact arrays whose trailing defaults are left out, and the API process
decodes them straight into these types. None of them can be part of a reference cycle, so the
garbage collector does not track them (`gc=False`): a step makes one of each per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec


# Every reason the engine ends a sequence with: EOS or a stop string or token, max_tokens (or the model's
# length), or a failed step. An aborted request gets no further output, so it has no reason of its own.
FinishReason = Literal["stop", "length", "error"]


class TokenLogprob(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []  # best alternatives, most likely first


class CompletionOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    index: int
    text: str  # new text since the previous output of this request
    token_ids: list[int]  # new tokens since the previous output
    logprobs: list[TokenLogprob] | None = None  # one per new token, when asked for
    finish_reason: FinishReason | None = None
    # Sum of the tokens' log-probabilities under the raw model distribution, when the request scores its samples
    # (logprobs or n > 1: SamplingParams.scores_samples) or searches beams (the hypothesis's sum); 0.0 otherwise.
    cumulative_logprob: float = 0.0
    score: float | None = None  # beam search: the length-penalised score


class RequestOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    num_prompt_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None  # with the first output, when asked for
    error: str | None = None
    queue_time: float | None = None  # seconds from arrival to first scheduled (first output only)


def merge_outputs(outputs: Sequence[RequestOutput]) -> RequestOutput:
    """One output covering consecutive outputs of one request, oldest first: each completion's text, tokens
    and log-probabilities joined in order, its latest finish reason and scores; what only a first or a last
    output carries (prompt log-probabilities, queue time, an error) kept. The outputs given are left as
    they are; a single one is returned itself."""
    if len(outputs) == 1:
        return outputs[0]
    texts: dict[int, list[str]] = {}  # per completion index, in order of first appearance
    token_ids: dict[int, list[int]] = {}
    logprobs: dict[int, list[TokenLogprob] | None] = {}
    latest: dict[int, CompletionOutput] = {}
    prompt_logprobs = error = queue_time = None
    for out in outputs:
        for c in out.outputs:
            if c.index not in latest:
                texts[c.index], token_ids[c.index], logprobs[c.index] = [], [], None
            latest[c.index] = c
            texts[c.index].append(c.text)
            token_ids[c.index] += c.token_ids
            if c.logprobs is not None:
                joined = logprobs[c.index]
                if joined is None:
                    logprobs[c.index] = list(c.logprobs)
                else:
                    joined += c.logprobs
        if prompt_logprobs is None:
            prompt_logprobs = out.prompt_logprobs
        if queue_time is None:
            queue_time = out.queue_time
        error = error or out.error
    last = outputs[-1]
    completions = [CompletionOutput(i, "".join(texts[i]), token_ids[i], logprobs[i], c.finish_reason,
                                    c.cumulative_logprob, c.score) for i, c in latest.items()]
    return RequestOutput(last.request_id, completions, last.finished, last.num_prompt_tokens, prompt_logprobs, error,
                         queue_time)
