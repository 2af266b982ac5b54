"""The four parts of the benchmark; each returns a JSON-ready dict.

1. throughput  GPT-2-small under 64 concurrent requests: Quill vs HF one at a time vs HF static batches
2. decode      one request alone: ms per token against the memory-bandwidth floor
3. recurrent   LSTM and gated CNN: the engine's batching vs one request at a time
4. memory      K,V bytes per token, and every engine's cache empty again once its requests finish
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

from quill.clients.bench.workload import TargetModel, WorkloadSpec, build_requests
from quill.models.loading.checkpoint import LoadedModel, load_checkpoint
from quill.server.hosting import RECURRENT_MAX_MODEL_LEN

from . import hf_runs, quill_runs
from .checkpoints import describe_model, gpt2_source, load_recurrent, save_random_gpt2
from .hf_models import pad_token_id
from .settings import BenchSettings
from .timing import DecodeTiming
from .tokenized import TokenizedRequest, spread_subset, tokenize


@dataclass
class BenchContext:
    """What the parts share: settings, measured hardware limits, the GPT-2 model (built once)."""

    settings: BenchSettings
    matmul_flops: float
    read_bandwidth: float
    cache_checks: list[dict] = field(default_factory=list)  # one per engine run, for the memory part
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, init=False, repr=False)

    @cached_property
    def gpt2(self) -> tuple[object, LoadedModel]:
        """(Hugging Face model, the same directory loaded by Quill), float32 on the CPU."""
        self._tmp = tempfile.TemporaryDirectory(prefix="quill-bench-gpt2-")
        hf_model = save_random_gpt2(self._tmp.name, self.settings.gpt2, seed=self.settings.seed)
        return hf_model, load_checkpoint(self._tmp.name, device="cpu", dtype="float32", name="gpt2-random")

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def workload(self, loaded: LoadedModel, salt: int = 0, **changes) -> list[TokenizedRequest]:
        """The settings' workload of token-id prompts (greedy, EOS ignored), with `changes` to its spec;
        `salt` draws other prompts from the same seed."""
        s = self.settings
        spec = replace(WorkloadSpec(s.num_requests, s.prompt_lens, s.max_tokens, models=["bench"], seed=s.seed,
                                    prompts="ids"), **changes)
        target = TargetModel(loaded.max_seq_len or RECURRENT_MAX_MODEL_LEN, vocab_size=loaded.model.config.vocab_size)
        return tokenize(build_requests(spec, {"bench": target}, salt), tag=f"s{salt}-r")

    def warmup(self, loaded: LoadedModel) -> list[TokenizedRequest]:
        """Other prompts than the timed ones (the prefix cache must not help), short outputs."""
        return self.workload(loaded, salt=1, num_requests=min(4, self.settings.num_requests), max_tokens=(2, 2))

    def check_cache(self, run: str, engine, peak: float | None = None) -> None:
        self.cache_checks.append({"run": run, "usage_after": engine.cache.usage, "peak_usage": peak})

    def mfu(self, tokens_per_s: float, num_parameters: int) -> float:
        """Model FLOP utilization: 2 FLOPs per parameter per token, over the measured matmul peak."""
        return tokens_per_s * 2 * num_parameters / self.matmul_flops


def throughput(ctx: BenchContext) -> dict:
    s = ctx.settings
    hf_model, loaded = ctx.gpt2
    requests, warmup = ctx.workload(loaded), ctx.warmup(loaded)
    params = loaded.num_parameters

    engine = quill_runs.make_engine(loaded, requests + warmup, s.block_size, max_num_seqs=s.num_requests)
    quill = quill_runs.engine_throughput(engine, requests, warmup)
    ctx.check_cache("transformer throughput (Quill, all at once)", engine, quill.peak_cache_usage)
    del engine

    subset = spread_subset(requests, s.hf_serial_subset)
    serial = hf_runs.serial(hf_model, subset, pad_token_id(loaded))
    static = hf_runs.static_batches(hf_model, requests, s.num_requests, pad_token_id(loaded))

    extrapolated = len(subset) < len(requests)
    return {
        "model": describe_model(loaded, gpt2_source(s.gpt2)) | {"config": s.gpt2},
        "workload": _describe_workload(requests),
        "quill": quill.to_dict(
            mfu=ctx.mfu(quill.tokens_per_s, params),
            mfu_all_tokens=ctx.mfu((quill.generated_tokens + quill.prompt_tokens) / quill.seconds, params),
        ),
        "hf_serial": serial.to_dict(
            mfu=ctx.mfu(serial.tokens_per_s, params), extrapolated=extrapolated,
            estimated_seconds_all=sum(r.max_tokens for r in requests) / serial.tokens_per_s,
        ),
        "hf_static": static.to_dict(
            computed_tokens_per_s=static.computed_tokens_per_s, mfu=ctx.mfu(static.tokens_per_s, params),
            mfu_computed=ctx.mfu(static.computed_tokens_per_s, params),
        ),
        "ratios": {
            "quill_vs_hf_static": quill.tokens_per_s / static.tokens_per_s,
            "quill_vs_hf_serial": quill.tokens_per_s / serial.tokens_per_s,
        },
    }


def _describe_workload(requests: list[TokenizedRequest]) -> dict:
    prompts = [len(r.prompt_token_ids) for r in requests]
    outs = [r.max_tokens for r in requests]
    return {
        "num_requests": len(requests), "prompt_tokens": sum(prompts), "generated_tokens": sum(outs),
        "prompt_lens": [min(prompts), max(prompts)], "max_tokens": [min(outs), max(outs)],
        "sampling": "greedy, ignore_eos (every request generates exactly max_tokens)",
    }


def decode(ctx: BenchContext) -> dict:
    s = ctx.settings
    hf_model, loaded = ctx.gpt2
    # A fresh prompt per repeat, so Quill's prefix cache never skips a prefill that HF has to run.
    requests = ctx.workload(loaded, salt=2, num_requests=s.decode_repeats + 1,
                            prompt_len=(s.decode_prompt_len,) * 2, max_tokens=(s.decode_new_tokens,) * 2)
    warm, timed = replace(requests[0], request_id="warmup", max_tokens=4), requests[1:]

    def median_of_repeats(run_one) -> DecodeTiming:
        run_one(warm)
        return DecodeTiming.from_runs([run_one(r) for r in timed])

    engine = quill_runs.make_engine(loaded, requests, s.block_size, max_num_seqs=1)
    quill = median_of_repeats(lambda r: quill_runs.engine_decode(engine, r))
    ctx.check_cache("single-request decode (Quill engine)", engine)
    loop = median_of_repeats(lambda r: quill_runs.step_loop(loaded, r, s.block_size))
    hf = median_of_repeats(lambda r: hf_runs.decode(hf_model, r, pad_token_id(loaded)))

    model = describe_model(loaded, gpt2_source(s.gpt2))
    floor_ms = 1000 * model["weight_bytes"] / ctx.read_bandwidth
    timings = {"quill_engine": quill, "quill_step_loop": loop, "hf_generate": hf}
    return {
        "model": model,
        "prompt_tokens": s.decode_prompt_len,
        "new_tokens": s.decode_new_tokens,
        "floor_ms_per_token": floor_ms,
        **{name: asdict(t) | {"ratio_to_floor": t.ms_per_token / floor_ms} for name, t in timings.items()},
    }


def recurrent(ctx: BenchContext) -> dict:
    return {arch: _recurrent_one(ctx, arch) for arch in ("lstm", "gcnn")}


def _recurrent_one(ctx: BenchContext, architecture: str) -> dict:
    s = ctx.settings
    loaded, source = load_recurrent(architecture, s.recurrent_models)
    requests, warmup = ctx.workload(loaded), ctx.warmup(loaded)

    engine = quill_runs.make_engine(loaded, requests + warmup, s.block_size, max_num_seqs=s.num_requests)
    batched = quill_runs.engine_throughput(engine, requests, warmup)
    ctx.check_cache(f"{architecture} throughput (Quill, all at once)", engine, batched.peak_cache_usage)
    subset = spread_subset(requests, s.recurrent_serial_subset)
    loop = quill_runs.step_loop_serial(loaded, subset, s.block_size)
    one_by_one = quill_runs.engine_serial(engine, subset, warmup)
    ctx.check_cache(f"{architecture} one at a time (Quill engine)", engine)
    return {
        "model": describe_model(loaded, source) | {"bytes_per_slot": engine.state.bytes_per_slot},
        "workload": _describe_workload(requests),
        "quill": batched.to_dict(),
        "step_loop_serial": loop.to_dict(extrapolated=len(subset) < len(requests)),
        "engine_serial": one_by_one.to_dict(extrapolated=len(subset) < len(requests)),
        "ratios": {
            "quill_vs_step_loop": batched.tokens_per_s / loop.tokens_per_s,
            "quill_vs_engine_serial": batched.tokens_per_s / one_by_one.tokens_per_s,
        },
    }


def memory(ctx: BenchContext) -> dict:
    s = ctx.settings
    _, loaded = ctx.gpt2
    if not ctx.cache_checks:  # run alone: serve a few requests so there is something to check
        requests = ctx.warmup(loaded)
        engine = quill_runs.make_engine(loaded, requests, s.block_size, max_num_seqs=len(requests))
        peak = quill_runs.drive(engine, requests)
        ctx.check_cache("memory check (Quill, a few requests)", engine, peak)
    c = loaded.model.config
    per_token = loaded.model.new_state(1, block_size=s.block_size).bytes_per_token
    return {
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_formula": "2 (K and V) x n_layers x n_kv_heads x head_dim x bytes per element",
        "kv_bytes_per_token_expected": 2 * c.n_layers * c.n_kv_heads * c.head_dim * loaded.dtype.itemsize,
        "kv_bytes_full_context": per_token * c.max_seq_len,
        "max_seq_len": c.max_seq_len,
        "cache_checks": ctx.cache_checks,
        "all_caches_empty_after": all(check["usage_after"] == 0 for check in ctx.cache_checks),
    }


PARTS = {"throughput": throughput, "decode": decode, "recurrent": recurrent, "memory": memory}
