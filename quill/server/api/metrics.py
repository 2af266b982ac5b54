"""Prometheus metrics, every series labelled by model. One registry per server (no globals)."""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from quill.server.engine import EngineStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        m = ["model"]
        self.requests = Counter("quill_requests", "Finished requests", m + ["finish_reason"], registry=r)
        self.request_errors = Counter("quill_request_errors", "Requests answered with an error", m + ["reason"], registry=r)
        self.prompt_tokens = Counter("quill_prompt_tokens", "Prompt tokens processed", m, registry=r)
        self.generation_tokens = Counter("quill_generation_tokens", "Tokens generated", m, registry=r)
        self.ttft = Histogram("quill_time_to_first_token_seconds", "Arrival to first token", m,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("quill_inter_token_latency_seconds", "Time between generated tokens", m,
                             buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("quill_e2e_request_latency_seconds", "Arrival to last token", m,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("quill_request_queue_time_seconds", "Arrival to first scheduled", m,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("quill_batch_size", "Sequences per engine step", m, buckets=BATCH_BUCKETS, registry=r)
        self.running = Gauge("quill_num_requests_running", "Requests being generated", m, registry=r)
        self.waiting = Gauge("quill_num_requests_waiting", "Requests waiting for admission", m, registry=r)
        self.cache_usage = Gauge("quill_cache_usage_ratio", "Fraction of the cache held by live sequences", m, registry=r)
        self.prefix_queries = Counter("quill_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", m,
                                      registry=r)
        self.prefix_hits = Counter("quill_prefix_cache_hits", "Prompt tokens found in the prefix cache", m, registry=r)
        self.preemptions = Counter("quill_num_preemptions", "Requests evicted from the cache to be recomputed", m,
                                   registry=r)
        # quill_cache_config_info{model, block_size, num_gpu_blocks, ...} 1, as vLLM's vllm:cache_config_info: what
        # the Inference Extension's endpoint picker sizes its prefix index from (cache_config_info.py)
        self.cache_config = Info("quill_cache_config", "The model's cache configuration, in the labels", m, registry=r)
        self._seen: dict[tuple[str, str], int] = {}  # cumulative engine counters already exported

    def init_model(self, model: str) -> None:
        """Create every series of a model at zero, so dashboards see them before the first request."""
        for metric in (self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e, self.queue_time,
                       self.batch_size, self.running, self.waiting, self.cache_usage, self.prefix_queries,
                       self.prefix_hits, self.preemptions):
            metric.labels(model=model)

    def set_cache_config(self, model: str, labels: dict[str, str]) -> None:
        self.cache_config.labels(model=model).info(labels)

    def engine_step(self, model: str, stats: EngineStats) -> None:
        """Called with the engine's snapshot after every step (on the thread that receives it)."""
        self.running.labels(model=model).set(stats.num_running)
        self.waiting.labels(model=model).set(stats.num_waiting)
        self.cache_usage.labels(model=model).set(stats.cache_usage)
        if stats.step_num_seqs:
            self.batch_size.labels(model=model).observe(stats.step_num_seqs)
        for counter, key, total in (
            (self.prefix_queries, "queries", stats.prefix_queries),
            (self.prefix_hits, "hits", stats.prefix_hits),
            (self.preemptions, "preemptions", stats.num_preemptions),
        ):
            delta = total - self._seen.get((model, key), 0)
            if delta > 0:
                counter.labels(model=model).inc(delta)
                self._seen[(model, key)] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)


def observe_repeated(histogram, value: float, count: int) -> None:
    """`count` observations of `value` in one histogram series, at the cost of one: a stream's output that
    joins several steps counts each of its tokens. Uses the series' own fields (`_sum`, `_buckets`,
    `_upper_bounds`, the last of them +Inf) as `Histogram.observe` does; tests check it against `observe`."""
    histogram._sum.inc(value * count)
    histogram._buckets[bisect_left(histogram._upper_bounds, value)].inc(count)
