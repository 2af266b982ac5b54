"""Keyword arguments of the client -> the /v1/completions body, and the retry policy."""

from __future__ import annotations

import random

# Client keyword -> API field. Beam search is asked for by width, as people think of it.
FIELDS = {
    "model": "model", "max_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k",
    "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "logit_bias": "logit_bias",
    "stop": "stop", "stop_token_ids": "stop_token_ids", "seed": "seed", "n": "n", "logprobs": "logprobs",
    "echo": "echo", "ignore_eos": "ignore_eos", "min_tokens": "min_tokens", "length_penalty": "length_penalty",
    "early_stopping": "early_stopping", "user": "user", "length_penalty_type": "length_penalty_type",
    "no_repeat_ngram_size": "no_repeat_ngram_size", "bad_words": "bad_words",
    # encoder-decoder (translation) models
    "source_lang": "source_lang", "target_lang": "target_lang", "target_prefix": "target_prefix",
    "coverage_penalty": "coverage_penalty", "coverage_penalty_type": "coverage_penalty_type",
    "coverage_penalty_stepwise": "coverage_penalty_stepwise",
}
RETRY_STATUSES = {429, 503}


def completion_body(prompt, *, stream: bool = False, beam_width: int | None = None, **options) -> dict:
    unknown = set(options) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    body = {"prompt": prompt, "stream": stream}
    body.update({FIELDS[k]: v for k, v in options.items() if v is not None})
    if beam_width is not None:
        body.update(use_beam_search=True, best_of=beam_width)
        body.setdefault("temperature", 0)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def retry_delay(attempt: int, retry_after: str | None, backoff: float, cap: float = 30.0) -> float:
    """Seconds before retry number `attempt` (from 0): the server's Retry-After if it gave one,
    else exponential backoff with jitter."""
    if retry_after is not None:
        try:
            return min(cap, max(0.0, float(retry_after)))
        except ValueError:
            pass
    return min(cap, backoff * 2**attempt) * (0.5 + random.random() / 2)
