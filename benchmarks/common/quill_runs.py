"""Timed runs of Quill in-process: the engine (batched, at a fixed concurrency, or one request at a time)
and the bare model step loop."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import LoadedModel
from quill.server.config import ServerConfig
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams

from .timing import TimedRun
from .tokenized import TokenizedRequest, num_generated, num_prompt_tokens


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


def _width(request: TokenizedRequest) -> int:
    """Sequences a request runs at once: its samples or its beams."""
    return max(request.num_returned, request.options.get("beam_width", 1))


def blocks_needed(requests: list[TokenizedRequest], block_size: int) -> int:
    """K,V blocks that hold every request at full length at once (every sample or beam its own copy)."""
    return sum((-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) + 1) * _width(r) for r in requests)


def make_engine(loaded: LoadedModel, requests: list[TokenizedRequest], block_size: int,
                max_num_seqs: int) -> EngineCore:
    """An engine whose K,V cache holds every request at full length, so nothing is preempted."""
    return EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=max_num_seqs),
        CacheConfig(block_size=block_size, num_blocks=blocks_needed(requests, block_size)),
    ))


def engine_config(server: ServerConfig) -> EngineConfig:
    """As `server.hosting` builds it from `quill serve`'s flags."""
    return EngineConfig(
        SchedulerConfig(server.max_num_seqs, server.max_num_batched_tokens, server.max_queue),
        CacheConfig(block_size=server.block_size, cache_bytes=server.cache_bytes,
                    enable_prefix_caching=server.enable_prefix_caching),
        enforce_eager=server.enforce_eager,
        async_scheduling=server.async_scheduling,
    )


def sampling_params(request: TokenizedRequest) -> SamplingParams:
    """As the OpenAI route maps a request's fields (beam search: best_of is the width); EOS ignored."""
    o = request.options
    if "beam_width" in o:
        return SamplingParams(n=o.get("n", 1), max_tokens=request.max_tokens, temperature=0, use_beam_search=True,
                              beam_width=o["beam_width"], ignore_eos=True)
    return SamplingParams(n=o.get("n", 1), max_tokens=request.max_tokens, temperature=o.get("temperature", 1.0),
                          top_k=o.get("top_k", -1), top_p=o.get("top_p", 1.0), min_p=o.get("min_p", 0.0),
                          seed=request.seed, ignore_eos=True)


def drive(engine: EngineCore, requests: list[TokenizedRequest], concurrency: int | None = None, on_tokens=None,
          log: StepLog | None = None, tokens: dict[str, list[int]] | None = None) -> float:
    """Step until every request finished, at most `concurrency` in flight (a new one enters when one
    finishes; None: all submitted at once); returns the peak cache usage.

    `on_tokens()` is called after every step that produced tokens (for per-token timing). `tokens`, when given,
    receives each request's generated token ids (its first sequence's), by request id.
    """
    waiting = list(reversed(requests))
    counts = {r.request_id: 0 for r in requests}
    in_flight, peak = 0, 0.0
    while waiting or engine.has_work():
        while waiting and (concurrency is None or in_flight < concurrency):
            r = waiting.pop()
            engine.add_request(r.request_id, r.prompt_token_ids, sampling_params(r))
            in_flight += 1
        start = time.perf_counter()
        outputs = engine.step()
        if log is not None:
            log.steps.append((time.perf_counter() - start, engine.last_step.num_seqs, engine.last_step.num_tokens))
        peak = max(peak, engine.cache.usage)
        for out in outputs:
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            counts[out.request_id] += sum(len(c.token_ids) for c in out.outputs)
            if tokens is not None:  # the first sequence's new tokens, if it has any (outputs[0] may be another)
                for c in out.outputs:
                    if c.index == 0:
                        tokens.setdefault(out.request_id, []).extend(c.token_ids)
            in_flight -= out.finished
        if on_tokens is not None and outputs:
            on_tokens()
    expected = {r.request_id: r.max_tokens * r.num_returned for r in requests}
    short = {rid: n for rid, n in counts.items() if n != expected[rid]}
    if short:
        raise RuntimeError(f"requests did not generate exactly max_tokens: {short}")
    return peak


def engine_throughput(engine: EngineCore, requests: list[TokenizedRequest], warmup: list[TokenizedRequest],
                      concurrency: int | None = None, tokens: dict[str, list[int]] | None = None) -> EngineRun:
    """`requests` stepped to completion, at most `concurrency` at a time (None: all submitted at once),
    after a warm-up on other prompts; `tokens`: see `drive`."""
    drive(engine, warmup)
    preempted_before = engine.scheduler.num_preemptions
    log = StepLog()
    start = time.perf_counter()
    peak = drive(engine, requests, concurrency, log=log, tokens=tokens)
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


def engine_serial(engine: EngineCore, requests: list[TokenizedRequest], warmup: list[TokenizedRequest]) -> TimedRun:
    """The same engine given one request at a time: each must finish before the next arrives."""
    drive(engine, warmup[:1])
    start = time.perf_counter()
    for r in requests:
        drive(engine, [r])
    return TimedRun(len(requests), num_generated(requests), num_prompt_tokens(requests), time.perf_counter() - start)


def engine_decode(engine: EngineCore, request: TokenizedRequest) -> tuple[float, list[float]]:
    """One request alone: (start time, arrival time of each generated token)."""
    arrivals: list[float] = []
    start = time.perf_counter()
    drive(engine, [request], on_tokens=lambda: arrivals.append(time.perf_counter()))
    return start, arrivals


@torch.inference_mode()
def step_loop(loaded: LoadedModel, request: TokenizedRequest, block_size: int) -> tuple[float, list[float]]:
    """The model's incremental `step` driven directly for one sequence, greedy, no engine around it.

    What `quill generate` does, minus sampling and text: the least a single stream can cost.
    Returns (start time, arrival time of each generated token).
    """
    model, prompt = loaded.model, request.prompt_token_ids
    num_blocks = -(-(len(prompt) + request.max_tokens) // block_size)
    if model.state_kind == "paged_kv":
        state = model.new_state(num_blocks, block_size=block_size)
        where = dict(block_tables=[list(range(num_blocks))])
    elif model.state_kind == "hybrid":  # a slot beside K,V blocks (LFM2)
        state = model.new_state(num_blocks, 1, block_size=block_size)
        where = dict(block_tables=[list(range(num_blocks))], slots=[0])
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


def step_loop_serial(loaded: LoadedModel, requests: list[TokenizedRequest], block_size: int) -> TimedRun:
    step_loop(loaded, requests[0], block_size)  # warm-up
    start = time.perf_counter()
    for r in requests:
        step_loop(loaded, r, block_size)
    return TimedRun(len(requests), num_generated(requests), num_prompt_tokens(requests), time.perf_counter() - start)
