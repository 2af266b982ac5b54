"""Quill's engine driven in-process on the bench's workload: what the server does, minus HTTP.

The same engine settings as `quill serve`'s defaults, the same requests, and the same
concurrency (a new request enters when one finishes). Its tokens/s against the server's
gives the cost of everything between the engine and the bench client: FastAPI, SSE,
the event loop, and the client's own parsing on the same cores.
"""

from __future__ import annotations

import time

from models.checkpoint import LoadedModel
from server.config import ServerConfig
from server.engine.core import CacheConfig, EngineConfig, EngineCore
from server.engine.scheduler import SchedulerConfig
from server.sampling import SamplingParams

from .baseline_hf import BaselineItem, one_per_strategy


def engine_config(server: ServerConfig) -> EngineConfig:
    """As `server.hosting` builds it from `quill serve`'s flags."""
    return EngineConfig(
        SchedulerConfig(server.max_num_seqs, server.max_num_batched_tokens, server.max_queue),
        CacheConfig(block_size=server.block_size, cache_bytes=server.cache_bytes,
                    enable_prefix_caching=server.enable_prefix_caching),
    )


def sampling_params(item: BaselineItem, seed: int, ignore_eos: bool) -> SamplingParams:
    """As the OpenAI route maps a request's fields (beam search: best_of is the width)."""
    o = item.options
    if "beam_width" in o:
        return SamplingParams(n=o.get("n", 1), max_tokens=item.max_tokens, temperature=0, use_beam_search=True,
                              beam_width=o["beam_width"], ignore_eos=ignore_eos)
    return SamplingParams(n=o.get("n", 1), max_tokens=item.max_tokens, temperature=o.get("temperature", 1.0),
                          top_k=o.get("top_k", -1), top_p=o.get("top_p", 1.0), min_p=o.get("min_p", 0.0),
                          seed=seed, ignore_eos=ignore_eos)


def run_engine(loaded: LoadedModel, items: list[BaselineItem], concurrency: int, ignore_eos: bool,
               server: ServerConfig | None = None) -> dict:
    """All `items` through one EngineCore, at most `concurrency` at a time; output tokens/s."""
    engine = EngineCore(loaded, engine_config(server or ServerConfig()))
    for i, warm in enumerate(one_per_strategy(items)):
        engine.add_request(f"warmup{i}", warm.prompt_ids, sampling_params(warm, seed=i, ignore_eos=True))
    while engine.has_work():
        engine.step()
    waiting = list(enumerate(items))
    in_flight, tokens, steps = 0, 0, 0
    start = time.perf_counter()
    while waiting or engine.has_work():
        while waiting and in_flight < concurrency:
            i, item = waiting.pop(0)
            engine.add_request(f"r{i}", item.prompt_ids, sampling_params(item, seed=i, ignore_eos=ignore_eos))
            in_flight += 1
        for out in engine.step():
            tokens += sum(len(c.token_ids) for c in out.outputs)
            in_flight -= out.finished
        steps += 1
    seconds = time.perf_counter() - start
    return {"num_requests": len(items), "concurrency": concurrency, "output_tokens": tokens, "steps": steps,
            "seconds": seconds, "output_token_throughput": tokens / seconds}
