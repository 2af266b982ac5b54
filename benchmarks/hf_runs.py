"""Timed runs of Hugging Face `generate()` on the same weights: one request at a time, and static batches."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from .timing import TimedRun
from .workload import BenchRequest, num_generated, num_prompt_tokens


@dataclass(slots=True)
class StaticBatchRun(TimedRun):
    computed_tokens: int = 0  # every row runs to its batch's longest max_tokens: padding and overrun included
    batch_size: int = 0

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


@torch.inference_mode()
def generate_one(model, request: BenchRequest, streamer=None) -> None:
    ids = torch.tensor([request.prompt_token_ids])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=request.max_tokens,
        streamer=streamer,
    )
    if out.shape[1] - ids.shape[1] != request.max_tokens:
        raise RuntimeError(f"generate stopped early on {request.request_id}")


def serial(model, requests: list[BenchRequest]) -> TimedRun:
    """`generate()` one request at a time, after one warm-up request."""
    generate_one(model, BenchRequest("warmup", requests[0].prompt_token_ids, 2))
    start = time.perf_counter()
    for r in requests:
        generate_one(model, r)
    return TimedRun(len(requests), num_generated(requests), num_prompt_tokens(requests), time.perf_counter() - start)


def decode(model, request: BenchRequest) -> tuple[float, list[float]]:
    """One request: (start time, arrival time of each generated token)."""
    streamer = ArrivalTimes()
    start = time.perf_counter()
    generate_one(model, request, streamer)
    return start, streamer.times


@torch.inference_mode()
def generate_batch(model, requests: list[BenchRequest], pad_token_id: int = 0) -> int:
    """One left-padded batch run to its longest max_tokens; returns the tokens computed (rows x new tokens)."""
    width = max(len(r.prompt_token_ids) for r in requests)
    ids = torch.full((len(requests), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, r in enumerate(requests):
        ids[row, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
        mask[row, width - len(r.prompt_token_ids):] = 1
    longest = max(r.max_tokens for r in requests)
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=longest, pad_token_id=pad_token_id)
    if out.shape[1] - width != longest:
        raise RuntimeError("a static batch stopped early")
    return len(requests) * longest


def static_batches(model, requests: list[BenchRequest], batch_size: int) -> StaticBatchRun:
    """Requests in arrival order, `batch_size` at a time; a batch starts when the previous one has finished."""
    generate_batch(model, [BenchRequest("warmup", r.prompt_token_ids[:8], 2) for r in requests[:batch_size]])
    start = time.perf_counter()
    computed = sum(generate_batch(model, requests[i : i + batch_size]) for i in range(0, len(requests), batch_size))
    seconds = time.perf_counter() - start
    return StaticBatchRun(
        len(requests), num_generated(requests), num_prompt_tokens(requests), seconds,
        computed_tokens=computed, batch_size=batch_size,
    )
