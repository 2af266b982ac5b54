"""Timed runs of Quill: the engine (batched or one request at a time) and the bare model step loop."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from models.batch import StepBatch
from models.checkpoint import LoadedModel
from server.engine.core import CacheConfig, EngineConfig, EngineCore
from server.engine.scheduler import SchedulerConfig
from server.sampling import SamplingParams

from .timing import TimedRun
from .workload import BenchRequest, num_generated, num_prompt_tokens


@dataclass(slots=True)
class EngineRun(TimedRun):
    steps: int = 0
    preemptions: int = 0
    peak_cache_usage: float = 0.0
    cache_usage_after: float = 0.0  # must be 0: every finished request gave its cache back
    cache_bytes: int = 0  # reserved up front
    prefill_steps: int = 0  # steps that computed prompt tokens (chunks of prompts, alongside decodes)
    prefill_step_seconds: float = 0.0
    decode_step_ms_median: float = 0.0  # steps of one new token per running sequence
    decode_step_batch_median: float = 0.0  # sequences in those steps


@dataclass(slots=True)
class StepLog:
    """(seconds, sequences, tokens) of every engine step, to split prefill from decode."""

    steps: list[tuple[float, int, int]] = field(default_factory=list)


def make_engine(loaded: LoadedModel, requests: list[BenchRequest], block_size: int, max_num_seqs: int) -> EngineCore:
    """An engine whose K,V cache holds every request at full length, so nothing is preempted."""
    blocks = sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) + 1 for r in requests)
    return EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=max_num_seqs), CacheConfig(block_size=block_size, num_blocks=blocks),
    ))


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def drive(engine: EngineCore, requests: list[BenchRequest], on_tokens=None, log: StepLog | None = None) -> float:
    """Submit `requests`, step until all finish; returns the peak cache usage.

    `on_tokens()` is called after every step that produced tokens (for per-token timing).
    """
    for r in requests:
        engine.add_request(r.request_id, r.prompt_token_ids, greedy(r.max_tokens))
    counts = {r.request_id: 0 for r in requests}
    peak = 0.0
    while engine.has_work():
        start = time.perf_counter()
        outputs = engine.step()
        if log is not None:
            log.steps.append((time.perf_counter() - start, engine.last_step.num_seqs, engine.last_step.num_tokens))
        peak = max(peak, engine.cache.usage)
        for out in outputs:
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            counts[out.request_id] += sum(len(c.token_ids) for c in out.outputs)
        if on_tokens is not None and outputs:
            on_tokens()
    expected = {r.request_id: r.max_tokens for r in requests}
    short = {rid: n for rid, n in counts.items() if n != expected[rid]}
    if short:
        raise RuntimeError(f"requests did not generate exactly max_tokens: {short}")
    return peak


def engine_throughput(engine: EngineCore, requests: list[BenchRequest], warmup: list[BenchRequest]) -> EngineRun:
    """All `requests` submitted at once and stepped to completion (after a warm-up on other prompts)."""
    drive(engine, warmup)
    preempted_before = engine.scheduler.num_preemptions
    log = StepLog()
    start = time.perf_counter()
    peak = drive(engine, requests, log=log)
    seconds = time.perf_counter() - start
    prefill = [s for s in log.steps if s[2] > s[1]]
    decode = [s for s in log.steps if s[2] == s[1]] or [(0.0, 0, 0)]
    return EngineRun(
        len(requests), num_generated(requests), num_prompt_tokens(requests), seconds, steps=len(log.steps),
        preemptions=engine.scheduler.num_preemptions - preempted_before, peak_cache_usage=peak,
        cache_usage_after=engine.cache.usage, cache_bytes=engine.cache_bytes,
        prefill_steps=len(prefill), prefill_step_seconds=sum(s[0] for s in prefill),
        decode_step_ms_median=1000 * statistics.median(s[0] for s in decode),
        decode_step_batch_median=statistics.median(s[1] for s in decode),
    )


def engine_serial(engine: EngineCore, requests: list[BenchRequest], warmup: list[BenchRequest]) -> TimedRun:
    """The same engine given one request at a time: each must finish before the next arrives."""
    drive(engine, warmup[:1])
    start = time.perf_counter()
    for r in requests:
        drive(engine, [r])
    return TimedRun(len(requests), num_generated(requests), num_prompt_tokens(requests), time.perf_counter() - start)


def engine_decode(engine: EngineCore, request: BenchRequest) -> tuple[float, list[float]]:
    """One request alone: (start time, arrival time of each generated token)."""
    arrivals: list[float] = []
    start = time.perf_counter()
    drive(engine, [request], on_tokens=lambda: arrivals.append(time.perf_counter()))
    return start, arrivals


@torch.inference_mode()
def step_loop(loaded: LoadedModel, request: BenchRequest, block_size: int) -> tuple[float, list[float]]:
    """The model's incremental `step` driven directly for one sequence, greedy, no engine around it.

    What `quill generate` does, minus sampling and text: the least a single stream can cost.
    Returns (start time, arrival time of each generated token).
    """
    model, prompt = loaded.model, request.prompt_token_ids
    if model.state_kind == "paged_kv":
        num_blocks = -(-(len(prompt) + request.max_tokens) // block_size)
        state = model.new_state(num_blocks, block_size=block_size)
        where = dict(block_tables=[list(range(num_blocks))])
    else:
        state = model.new_state(1)
        where = dict(slots=[0])
    arrivals: list[float] = []
    start = time.perf_counter()
    new, position = prompt, 0
    for _ in range(request.max_tokens):
        batch = StepBatch.build([new], [position], device=loaded.device, **where)
        token = int(model.step(batch, state)[0].argmax())
        arrivals.append(time.perf_counter())
        position += len(new)
        new = [token]
    return start, arrivals


def step_loop_serial(loaded: LoadedModel, requests: list[BenchRequest], block_size: int) -> TimedRun:
    step_loop(loaded, requests[0], block_size)  # warm-up
    start = time.perf_counter()
    for r in requests:
        step_loop(loaded, r, block_size)
    return TimedRun(len(requests), num_generated(requests), num_prompt_tokens(requests), time.perf_counter() - start)
