"""The Hugging Face baseline: `generate()` on the same weights, one request at a time and in static batches.

Static batching is what `generate()` offers for many requests: requests of one decoding setting,
`batch_size` at a time in arrival order, each batch left-padded and run to its longest max_tokens
before the next one starts. Every request generates exactly its max_tokens (EOS is held off by
`min_new_tokens`), as Quill's `ignore_eos` does, and a run that stops short is an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate

import torch
from transformers.generation.streamers import BaseStreamer

from .timing import TimedRun
from .tokenized import TokenizedRequest, num_generated, num_prompt_tokens, one_per_setting


@dataclass(slots=True)
class StaticBatchRun(TimedRun):
    computed_tokens: int = 0  # every row runs to its batch's longest max_tokens: padding and overrun included
    batch_size: int = 0
    num_batches: int = 0

    @property
    def computed_tokens_per_s(self) -> float:
        return self.computed_tokens / self.seconds


class ArrivalTimes(BaseStreamer):
    """Records when each generated token comes out of `generate` (the first `put` is the prompt)."""

    def __init__(self):
        self.times: list[float] = []
        self.seen_prompt = False

    def put(self, value):
        if self.seen_prompt:
            self.times.append(time.perf_counter())
        self.seen_prompt = True

    def end(self):
        pass


def generate_kwargs(options: dict, max_tokens: int) -> dict:
    """A request's client options as `generate()` arguments: the decoding the server is asked for."""
    kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens)
    if "beam_width" in options:
        return kw | dict(do_sample=False, num_beams=options["beam_width"], num_return_sequences=options.get("n", 1))
    if options.get("temperature", 1.0) == 0:
        return kw | dict(do_sample=False)  # the mix has no greedy n > 1: its samples would all be the same
    kw |= dict(do_sample=True, temperature=options.get("temperature", 1.0), top_k=max(0, options.get("top_k", 0)),
               top_p=options.get("top_p", 1.0), num_return_sequences=options.get("n", 1))
    if "min_p" in options:
        kw["min_p"] = options["min_p"]
    return kw


@torch.inference_mode()
def generate_batch(model, requests: list[TokenizedRequest], pad_id: int, streamer=None,
                   tokens: dict[str, list[int]] | None = None) -> int:
    """One left-padded batch of one decoding setting, run to its longest max_tokens (a batch of one needs
    no padding); returns the token positions computed (returned rows x new tokens). `tokens`, when given,
    receives each request's generated ids (its first returned row's, cut to its max_tokens), by request id."""
    width = max(len(r.prompt_token_ids) for r in requests)
    ids = torch.full((len(requests), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros_like(ids)
    for row, r in enumerate(requests):
        ids[row, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
        mask[row, width - len(r.prompt_token_ids):] = 1
    longest = max(r.max_tokens for r in requests)
    device = next(model.parameters()).device
    out = model.generate(ids.to(device), attention_mask=mask.to(device), pad_token_id=pad_id, streamer=streamer,
                         **generate_kwargs(requests[0].options, longest))
    if out.shape[1] - width != longest:
        raise RuntimeError(f"generate() stopped after {out.shape[1] - width} of {longest} tokens")
    if tokens is not None:
        first_rows = accumulate((r.num_returned for r in requests), initial=0)  # a request's rows follow its own
        for row, r in zip(first_rows, requests):
            tokens[r.request_id] = out[row, width:width + r.max_tokens].tolist()
    return longest * sum(r.num_returned for r in requests)


def serial(model, requests: list[TokenizedRequest], pad_id: int, tokens: dict[str, list[int]] | None = None,
           ) -> TimedRun:
    """`generate()` one request at a time, each after the previous one finished (after short warm-ups);
    `tokens`: see `generate_batch`."""
    for warm in one_per_setting(requests):
        generate_batch(model, [warm], pad_id)
    start = time.perf_counter()
    for r in requests:
        generate_batch(model, [r], pad_id, tokens=tokens)
    return TimedRun(len(requests), num_generated(requests), num_prompt_tokens(requests), time.perf_counter() - start)


def static_batches(model, requests: list[TokenizedRequest], batch_size: int, pad_id: int) -> StaticBatchRun:
    """Requests grouped by decoding setting, `batch_size` at a time in arrival order; one batch at a time."""
    groups: dict[str, list[TokenizedRequest]] = {}
    for r in requests:
        groups.setdefault(r.setting, []).append(r)
    batches = [g[i:i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]
    for warm in one_per_setting(requests):
        generate_batch(model, [warm, warm], pad_id)
    start = time.perf_counter()
    computed = sum(generate_batch(model, batch, pad_id) for batch in batches)
    seconds = time.perf_counter() - start
    return StaticBatchRun(len(requests), num_generated(requests), num_prompt_tokens(requests), seconds,
                          computed_tokens=computed, batch_size=batch_size, num_batches=len(batches))


def decode(model, request: TokenizedRequest, pad_id: int) -> tuple[float, list[float]]:
    """One request alone (greedy or sampling, not beam search): (start time, arrival time of each new token)."""
    streamer = ArrivalTimes()
    start = time.perf_counter()
    generate_batch(model, [request], pad_id, streamer)
    return start, streamer.times
