"""The engine step for one model: schedule -> run -> update.

`scheduler.schedule()` picks the step's work in plain Python, `runner.run()` does every tensor
operation and returns chosen tokens, and `_update` commits them: prompt scores, forks into n
samples, beam moves, then the output processor's deltas. Single-threaded on purpose: `AsyncEngine`
runs it on a thread of its own and feeds it requests and aborts between steps. With
`async_scheduling` a decode step is launched before the host commits the one in flight (overlap.py).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field, replace

from quill.models.loading.checkpoint import LoadedModel
from quill.server.sampling import SamplingParams, new_generator
from quill.server.sampling.coverage import NEEDS_ATTENTION

from quill.server.structured import GrammarCompiler

from .beam_search import BeamSearch
from .cuda_graphs import CudaGraphs, GraphCapture, GraphCaptureError
from .current_device import make_current
from .graph_buckets import graph_batch_sizes
from .host_memory import keep_freed_memory
from .kv_events import KVEventsConfig, open_kv_events
from .output_processor import OutputProcessor
from .parallel.config import ParallelConfig
from .overlap import can_overlap, live_work
from .outputs import RequestOutput
from .runner import ModelRunner, PendingStep, StepResult
from .scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from .sequence import Sequence, SequenceGroup
from .cache.state_kinds import plan_state
from .warmup import warm_attention_variants

log = logging.getLogger("quill.engine")


@dataclass
class CacheConfig:
    block_size: int = 16  # tokens per K,V block, and the prefix-snapshot interval of fixed-size states
    cache_bytes: int | None = None  # K,V blocks, or state-slot snapshots (state_kinds.py); None: see memory.py
    gpu_memory_utilization: float = 0.9  # on CUDA without cache_bytes: this engine's share of the GPU's memory
    num_blocks: int | None = None  # overrides cache_bytes
    snapshots_per_seq: int = 2  # at most this many prefix-snapshot slots per sequence slot (fixed-size states)
    enable_prefix_caching: bool = True

    def __post_init__(self):
        if self.block_size < 1 or any(n is not None and n < 1 for n in (self.cache_bytes, self.num_blocks)):
            raise ValueError("block_size, cache_bytes and num_blocks must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], not {self.gpu_memory_utilization}")


@dataclass
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    enforce_eager: bool = False  # never replay decode steps as CUDA graphs (they are captured on CUDA only)
    # Launch a decode step while the host still commits the one before (overlap.py). None: on for a model on
    # CUDA, where the device computes while the host works (measured on an H100: the Llama-3-8B shape's decode
    # step at 256 sequences went from 71% to 95% GPU busy), off elsewhere, where the work is only reordered.
    async_scheduling: bool | None = None
    kv_events: KVEventsConfig | None = None  # where to publish the K,V prefix cache's events (kv_events/); None: off
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # tensor parallelism (parallel/); steps eager


@dataclass
class StepStats:
    num_seqs: int = 0
    num_tokens: int = 0
    num_preemptions: int = 0


@dataclass(slots=True)
class EngineStats:
    """What metrics read of an engine after a step: small and picklable, so it travels with each step's
    outputs when the core runs in a process of its own. Counters are cumulative."""

    num_running: int = 0
    num_waiting: int = 0
    cache_usage: float = 0.0
    step_num_seqs: int = 0  # sequences the last step ran (0: no step since the last snapshot)
    prefix_queries: int = 0
    prefix_hits: int = 0
    num_preemptions: int = 0


class EngineCore:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, max_model_len: int | None = None,
                 graph_capture: GraphCapture | None = None, grammars: GrammarCompiler | None = None):
        """`graph_capture`: how decode steps are captured as graphs; None: CUDA graphs on a CUDA device.
        `grammars`: compiles constrained requests' grammars (shared with the API when both are in one process)."""
        make_current(loaded.device)  # the cache's profiling steps and graph capture run on this thread
        if loaded.device.type == "cpu":
            keep_freed_memory()
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.tokenizer = loaded.tokenizer
        model, cache_cfg, sched_cfg = loaded.model, self.config.cache, self.config.scheduler
        # compiled before the cache is sized and before /ready (warmup.py)
        if loaded.device.type == "cuda" and not getattr(model, "is_encoder_decoder", False):
            start = time.perf_counter()
            if warm_attention_variants(model, cache_cfg.block_size):
                log.info("%s: attention kernels compiled for every query tile size in %.2fs", loaded.name,
                         time.perf_counter() - start)
        if (self.config.enforce_eager or self.config.parallel.size > 1
                or not getattr(model, "captures_decode_graphs", True)):
            graph_capture = None  # tensor-parallel decode steps (and a model that says so) run eagerly
        elif graph_capture is None and loaded.device.type == "cuda":
            graph_capture = CudaGraphs(loaded.device)
        graph_sizes = []
        if graph_capture is not None:
            graph_sizes = graph_batch_sizes(sched_cfg.max_num_seqs, sched_cfg.max_num_batched_tokens)
        # Graphs' padding rows write to one block or slot past those the cache manager hands out.
        self.layout = plan_state(model, cache_cfg, sched_cfg, max_model_len or loaded.max_seq_len,
                                 spare=int(graph_capture is not None), graph_batch_size=max(graph_sizes, default=0))
        self.state, self.cache = self.layout.state, self.layout.cache
        self.kv_events = open_kv_events(self.config.kv_events, self.layout, loaded.name)
        self.scheduler = Scheduler(sched_cfg, self.cache)
        self.runner = ModelRunner(loaded, self.layout, sched_cfg.max_num_seqs, sched_cfg.max_num_batched_tokens)
        self.graph_bytes = 0  # device memory the captured graphs hold
        if graph_capture is not None:
            self._capture_graphs(graph_capture, graph_sizes)
        self.outputs = OutputProcessor(self.tokenizer, loaded.eos_token_ids, loaded.forced_eos_token_ids)
        self.grammars = grammars or GrammarCompiler(self.tokenizer, loaded.eos_token_ids, self.runner.vocab_size)
        self.groups: dict[str, SequenceGroup] = {}
        self._seq_ids = itertools.count()
        self.last_step = StepStats()
        overlap = self.config.async_scheduling
        self.async_scheduling = overlap if overlap is not None else loaded.device.type == "cuda"
        self._in_flight: PendingStep | None = None  # a launched step not yet committed (async_scheduling)
        self.num_overlapped_steps = 0  # steps launched while the one before was in flight

    def _capture_graphs(self, capture: GraphCapture, sizes: list[int]) -> None:
        """Capture the decode graphs at startup; a model whose step cannot be captured runs eagerly."""
        name = self.loaded.name
        start, before = time.perf_counter(), capture.memory_in_use()
        try:
            self.runner.capture_graphs(capture, sizes)
        except GraphCaptureError as e:
            self.runner.graphs.clear()
            capture.release()  # the graphs captured before it, and the pool they filled
            log.warning("%s: capturing the decode step of a batch of %d sequences as a CUDA graph failed (%s): "
                        "decode steps run eagerly; the memory set aside for graphs stays unused (--enforce-eager "
                        "skips capture)", name, e.batch_size, e.__cause__)
            return
        self.graph_bytes = max(0, capture.memory_in_use() - before)
        log.info("%s: captured decode graphs for batches of %s sequences in %.2fs, holding %.1f MiB "
                 "(--enforce-eager turns them off)", name, ", ".join(map(str, sizes)),
                 time.perf_counter() - start, self.graph_bytes / 2**20)

    # ---- requests ----------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        return self.layout.num_bytes

    @property
    def num_kv_blocks(self) -> int | None:
        return self.layout.num_kv_blocks

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    encoder_token_ids: list[int] | None = None, forced_token_ids: list[int] | None = None) -> None:
        """Queue a request; raises QueueFullError when the waiting queue is at its bound. An encoder-decoder model's
        request brings its source (`encoder_token_ids`); its prompt is the decoder's (its start token), and
        `forced_token_ids` (default: the params') are its first output tokens, taken as if generated with probability 1
        (the target language of M2M100, NLLB, mBART-50: transformers' forced_bos_token_id). For such a model a
        request with no source has its prompt taken as the source, the decoder starting from its start token."""
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt has no tokens")
        if self.loaded.bad_words_ids:  # the checkpoint's longer bad words, beside the request's own
            params = replace(params, bad_words_token_ids=params.bad_words_token_ids + self.loaded.bad_words_ids)
        group = SequenceGroup(request_id, list(prompt_token_ids), params)
        if encoder_token_ids is None and self.loaded.is_encoder_decoder:  # the prompt is the source
            encoder_token_ids, prompt_token_ids = prompt_token_ids, [self.loaded.model.config.decoder_start_token_id]
            group.prompt_token_ids = list(prompt_token_ids)
        if encoder_token_ids is not None:
            if not encoder_token_ids:
                raise ValueError("the source has no tokens")
            group.encoder_token_ids = list(encoder_token_ids)
        if params.seed is not None:  # each output of a seeded request has its own stream
            group.generators = [new_generator(params.seed + i, self.loaded.device) for i in range(params.n)]
        if params.follows_coverage and not getattr(self.loaded.model, "aligns", False):
            raise ValueError(f"coverage_penalty {NEEDS_ATTENTION}")
        if params.use_beam_search:
            group.beam = BeamSearch(
                width=params.beam_width, max_tokens=params.max_tokens,
                eos_token_ids=[] if params.ignore_eos else list(self.loaded.eos_token_ids),
                length_penalty=params.length_penalty, early_stopping=params.early_stopping,
                min_tokens=params.min_tokens, length_penalty_type=params.length_penalty_type,
                forced_eos_token_ids=[] if params.ignore_eos else list(self.loaded.forced_eos_token_ids),
                penalty_never_falls=params.follows_coverage and params.coverage_penalty_type == "summary",
                stepwise=params.coverage_penalty_stepwise,
            )
        first = self._new_sequence(group, list(prompt_token_ids), 0)
        if params.structured is not None:  # cached when the API process checked it; GrammarError if refused
            first.grammar = self.grammars.matcher(params.structured)
        forced = forced_token_ids or params.forced_token_ids
        if not forced and group.encoder_token_ids is not None:  # the checkpoint's own first token (BART's <s>)
            bos = self.loaded.model.config.forced_bos_token_id
            forced = [] if bos is None else [bos]
        for token in forced:
            self.outputs.append(first, token, 0.0, None)
        group.seqs.append(first)
        self.scheduler.add(group)
        self.groups[request_id] = group

    def abort(self, request_id: str) -> bool:
        group = self.groups.pop(request_id, None)
        if group is None:
            return False
        self.scheduler.remove(group)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    def discard_in_flight(self) -> None:
        """Forget a launched step without committing it: after a fault, its requests are failed anyway."""
        self._in_flight = None

    def reset_cache(self) -> None:
        """After a failed step: rebuild the cache (CacheManager.reset), and publish that step's KV-cache events
        followed by what the reset took back."""
        self.cache.reset()
        if self.kv_events is not None:
            self.kv_events.flush()

    def close(self) -> None:
        """Stop publishing KV-cache events (from the thread that steps the core)."""
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None

    def stats(self, stepped: bool = True) -> EngineStats:
        """A snapshot for metrics; `stepped`: whether a step ran since the last snapshot."""
        scheduler, cache = self.scheduler, self.cache
        return EngineStats(len(scheduler.running), len(scheduler.waiting), cache.usage,
                           self.last_step.num_seqs if stepped else 0, cache.prefix_queries, cache.prefix_hits,
                           scheduler.num_preemptions)

    def describe_cache(self) -> str:
        """What the cache holds, for the startup log."""
        return self.layout.describe()

    def _new_sequence(self, group: SequenceGroup, token_ids: list[int], index: int) -> Sequence:
        seq = Sequence(next(self._seq_ids), group, token_ids, len(group.prompt_token_ids), index=index)
        self.outputs.start(seq)
        return seq

    # ---- one step ----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run a step; returns the outputs ready now (with async_scheduling: those of the step before). The
        cache's events of a step that returns are published (those of one that raises: by `reset_cache`)."""
        outputs = self._step()
        if self.kv_events is not None:
            self.kv_events.flush()
        return outputs

    def _step(self) -> list[RequestOutput]:
        if self._in_flight is not None:
            return self._overlapped_step()
        batch = self.scheduler.schedule()
        outputs = [self._retire(g, self.outputs.failed(g, "the request needs more cache than the server reserved"))
                   for g in batch.failed]
        self.last_step = StepStats(len(batch.work), batch.num_tokens, batch.num_preemptions)
        if self.async_scheduling and can_overlap(batch):
            self._in_flight = self.runner.launch(batch)
            return outputs + self._overlapped_step()
        if batch.work:
            result = self.runner.run(batch)
            self.cache.step_finished()
            self.scheduler.commit(batch)
            outputs += self._update(batch, result)
        return outputs

    def _overlapped_step(self) -> list[RequestOutput]:
        """Launch the next decode step if it can be known now, then commit the step in flight."""
        previous, self._in_flight = self._in_flight, None
        live = live_work(previous.batch)  # less what finished or was aborted since it was scheduled
        self.scheduler.commit(live)  # its input tokens are all on the host by now
        following = self.scheduler.schedule_decode(live)
        if following is not None:
            self._in_flight = self.runner.launch(following, inputs_from=previous)
            self.num_overlapped_steps += 1
            self.last_step = StepStats(len(following.work), len(following.work))  # a token each
        result = previous.result()
        self.cache.step_finished()  # the keys its commit registered above are now safe past a fault
        if len(live.work) < len(previous.batch.work):  # no token after an abort
            result.sampled = [(seq, chosen) for seq, chosen in result.sampled if seq.is_live]
        return self._update(previous.batch, result)

    def _update(self, batch: ScheduledBatch, result: StepResult) -> list[RequestOutput]:
        """Take in what the committed step chose; hand every touched request's delta out."""
        for seq, entries in result.prompt_logprobs:
            group = seq.group
            if group.prompt_logprobs is None:
                group.prompt_logprobs = [None]  # the first token has no context
            group.prompt_logprobs += entries
        append = self.outputs.append
        for seq, chosen in result.sampled:
            if len(chosen) == 1 and seq.group.is_forked:  # the common case: one more token of a running sample
                sampled = chosen[0]
                append(seq, sampled.token_id, sampled.logprob, sampled.entry)
                continue
            group = seq.group
            if not group.is_forked:
                self._fork(group)
            for target, sampled in zip(group.seqs if len(chosen) > 1 else [seq], chosen):
                append(target, sampled.token_id, sampled.logprob, sampled.entry)
        for group, scores, indices, penalties in result.beams:
            group.is_forked = True
            self._beam_step(group, scores, indices, penalties)
        outputs = []
        for group in dict.fromkeys(seq.group for seq, _ in batch.work):
            if group.is_finished:
                continue
            out, finished = self.outputs.collect(group)
            for seq in finished:
                self._finish(seq)
            if out is not None:
                outputs.append(self._retire(group, out) if out.finished else out)
        return outputs

    def _finish(self, seq: Sequence) -> None:
        """Free a finished sequence's cache, keeping its final state where the cache can (a chat's next turn goes on
        from there). A step in flight that reads the sequence computes its last token too, so the state kept then
        holds every token: the copy goes with the step after, which the device runs after that one."""
        in_flight = self._in_flight is not None and any(s is seq for s, _ in self._in_flight.batch.work)
        self.cache.retire(seq.seq_id, seq.token_ids, seq.num_computed + in_flight)

    def _fork(self, group: SequenceGroup) -> None:
        """The prompt is computed: split it into the request's n samples (each took its first token this step)."""
        group.is_forked = True
        parent = group.seqs[0]
        for index in range(1, group.params.n):
            child = self._new_sequence(group, list(parent.token_ids), index)
            child.num_computed = parent.num_computed
            if parent.grammar is not None:  # before the parent takes its first token: each sample its own
                child.grammar = parent.grammar.fork()
            self.cache.fork(parent.seq_id, child.seq_id)
            group.seqs.append(child)

    def _beam_step(self, group: SequenceGroup, scores: list[float], indices: list[int],
                   penalties: list[float] | None) -> None:
        old = group.seqs
        step = group.beam.advance(scores, indices, self.runner.vocab_size, [s.output_token_ids for s in old],
                                  penalties)
        # Free the beams nobody continues first, so their slots serve this step's forks.
        chosen = {parent_index for parent_index, _, _ in step.running}
        for i, seq in enumerate(old):
            if i not in chosen:
                self.cache.free(seq.seq_id)
        new: list[Sequence] = []
        reused: set[int] = set()
        for parent_index, _, _ in step.running:
            parent = old[parent_index]
            if parent_index in reused:  # a second child of the same parent: fork before anyone appends
                child = self._new_sequence(group, list(parent.token_ids), len(new))
                child.num_computed = parent.num_computed
                child.coverage = parent.coverage
                if parent.grammar is not None:
                    child.grammar = parent.grammar.fork()
                self.cache.fork(parent.seq_id, child.seq_id)
            else:
                reused.add(parent_index)
                child = parent
            new.append(child)
        for child, (_, token, score) in zip(new, step.running):
            child.token_ids.append(token)
            child.cumulative_logprob = score
            if child.grammar is not None:
                child.grammar.consume(token)
        group.seqs = new
        if step.done:
            for seq in group.seqs:
                self.cache.free(seq.seq_id)
            group.seqs = []

    def _retire(self, group: SequenceGroup, out: RequestOutput) -> RequestOutput:
        self.groups.pop(group.request_id, None)
        self.scheduler.remove(group)
        return out
