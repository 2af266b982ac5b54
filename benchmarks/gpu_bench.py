"""Quill on a GPU, side by side with transformers, for model shapes from GPT-2 small to Llama-3-8B and the state
families (Mamba, Mamba-2, LFM2, xLSTM, the bundled LSTM and gated CNN), in one run.

    python -m benchmarks.gpu_bench --device cuda --shapes gpt2 llama3.2-1b --out runs/gpu/bench.json
    python -m benchmarks.gpu_bench --device cuda --shapes llama3-8b --parts engine profile --out runs/gpu/8b.json
    python -m benchmarks.gpu_bench --device cuda --shapes mamba-1.4b lstm --parts engine http hf
    python -m benchmarks.gpu_bench --smoke                     # seconds on the CPU, tiny shapes: the code runs

For each shape: random weights of that shape are made on the device, saved as a Hugging Face directory
under a temporary directory (`--tmp-dir`) and loaded from there by Quill, by the server and by
transformers, so all run the same weights (the LSTM and gated CNN: the bundled checkpoints, no transformers).
Then the parts, in this order, each measured on its own:

  engine   256 streamed greedy requests (prompts 32-512 token ids, max_tokens 32-256, EOS ignored)
           through Quill's engine in-process, 256 at a time, with the server's settings
  batch1   one request alone: ms per token against the memory-bandwidth floor (weight bytes a decode
           step reads / the device's measured read bandwidth), for the engine and the bare model loop
  profile  decode steps of the engine with 256 sequences running, under torch.profiler: GPU time,
           kernel launches and wall time per step (on the CPU: CPU time inside torch operators)
  http     the same requests over HTTP: the real server (`quill serve`, flags from `--server-arg`
           too) on a loopback port, with `quill bench`'s load generator
  sizing   the real server again, its cache sized by --gpu-memory-utilization instead of fitted to the
           workload, under a burst of `sizing_seconds` with 256 streams in flight: none may fail or run out
           of memory, and the server's log line says how many tokens its cache holds
  hf       transformers `generate()` on the same requests in static left-padded batches
           (`--hf-batch-size`), and one request alone

Every figure is written to `--out` as soon as it is measured (the file is rewritten whole), so a run
that is stopped keeps what it measured; a part that fails is recorded with its error and the others
still run. See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import httpx
import torch

from quill.clients.bench import report as load_report
from quill.clients.bench.runner import run_workload
from quill.clients.bench.workload import build_requests
from quill.models.loading.checkpoint import BUNDLED_DIR, LoadedModel, load_checkpoint, resolve_device, resolve_dtype
from quill.server.config import ServerConfig
from quill.server.engine.core import CacheConfig, EngineCore

from . import gpu_report
from .common import hf_runs, quill_runs
from .common.bandwidth_floor import decode_read_bytes, floor_ms_per_token
from .common.checkpoints import describe_model, save_random_model
from .common.gpu_runs import Recorder, RunOptions, ShapeRun, target_model, workload_spec
from .common.gpu_settings import PRESETS, SHAPES, GpuBenchSettings
from .common.hardware import describe_device, describe_machine, load_average, read_bandwidth
from .common.hf_models import hf_model_for, max_logit_difference, pad_token_id
from .common.server_process import free_port, running_server, serve_command, server_process, with_serve_args
from .common.step_profile import decode_requests, profile_decode
from .common.timing import DecodeTiming
from .common.tokenized import TokenizedRequest, tokenize
from .http_bench import send_workload


# ---- the parts ---------------------------------------------------------------------------


def engine_part(r: ShapeRun) -> None:
    engine = EngineCore(r.loaded, quill_runs.engine_config(r.server))
    run = quill_runs.engine_throughput(engine, r.timed, r.warm_ids, r.settings.concurrency)
    r.record("engine", **run.to_dict(concurrency=r.settings.concurrency))


def _batch1_requests(r: ShapeRun) -> list[TokenizedRequest]:
    """A warm-up and `batch1_repeats` requests of the batch-1 lengths, each with a prompt of its own."""
    s = r.settings
    return r.workload(2, num_requests=s.batch1_repeats + 1, prompt_len=(s.batch1_prompt_len,) * 2,
                      max_tokens=(s.batch1_new_tokens,) * 2)


def _median_of_repeats(requests: list[TokenizedRequest], run_one) -> dict:
    run_one(replace(requests[0], max_tokens=4))  # warm-up
    return asdict(DecodeTiming.from_runs([run_one(q) for q in requests[1:]]))


def batch1_part(r: ShapeRun) -> None:
    s, requests = r.settings, _batch1_requests(r)
    floor = floor_ms_per_token(r.figures["model"]["decode_read_bytes"], r.recorder.results["limits"]["read_bandwidth"])
    r.record("batch1", prompt_tokens=s.batch1_prompt_len, new_tokens=s.batch1_new_tokens, floor_ms_per_token=floor)
    engine = quill_runs.make_engine(r.loaded, requests, s.block_size, max_num_seqs=1)
    r.record("batch1", engine=_median_of_repeats(requests, lambda q: quill_runs.engine_decode(engine, q)))
    loop = _median_of_repeats(requests, lambda q: quill_runs.step_loop(r.loaded, q, s.block_size))
    r.record("batch1", step_loop=loop)


def profile_part(r: ShapeRun) -> None:
    s = r.settings
    config = quill_runs.engine_config(r.server)
    scheduler = replace(config.scheduler, max_num_seqs=max(config.scheduler.max_num_seqs, s.profile_seqs),
                        max_queue=max(config.scheduler.max_queue, s.profile_seqs))
    requests = decode_requests(r.workload(3, num_requests=s.profile_seqs), scheduler.max_num_batched_tokens,
                               s.profile_warm_steps, s.profile_steps)
    cache = CacheConfig(block_size=s.block_size, num_blocks=quill_runs.blocks_needed(requests, s.block_size),
                        enable_prefix_caching=config.cache.enable_prefix_caching)
    engine = EngineCore(r.loaded, replace(config, scheduler=scheduler, cache=cache))
    trace_dir = r.options.trace_dir
    trace = trace_dir / f"{r.name}-decode-steps.json.gz" if trace_dir else None
    r.record("profile", **profile_decode(engine, requests, s.profile_warm_steps, s.profile_steps, trace))


def http_part(r: ShapeRun) -> None:
    s = r.settings
    extra = r.options.server_args
    r.record("http", command=["python", *serve_command(r.server)[1:], *extra])
    with running_server(r.server, s.ready_timeout, extra_args=extra) as url:
        r.options.log(f"{r.name}: sending {len(r.requests)} requests over HTTP, {s.concurrency} at a time ...")
        run = asyncio.run(send_workload(url, r.warm, r.requests, s.concurrency, s.duration, r.options.progress))
    r.record("http", **load_report.summarize(run))


def sizing_part(r: ShapeRun) -> None:
    """The real server sizing its cache from --gpu-memory-utilization (no --cache-bytes), then a burst of
    `sizing_seconds` with `concurrency` streamed requests in flight, a new one as each ends: every answered
    request must succeed, no step may run out of memory, and the server must stay healthy."""
    s, extra = r.settings, r.options.server_args
    server = replace(r.server, cache_bytes=None, port=free_port())
    spec = replace(workload_spec(s, r.name), num_requests=s.concurrency * 40)  # more than the burst can answer
    requests = build_requests(spec, {r.name: target_model(r.loaded)}, salt=5)
    r.record("sizing", command=["python", *serve_command(server)[1:], *extra], seconds=s.sizing_seconds)
    with tempfile.TemporaryFile(mode="w+") as output:
        with server_process(server, s.ready_timeout, extra_args=extra, output=output) as (url, _):
            r.options.log(f"{r.name}: {s.sizing_seconds:.0f} s burst, {s.concurrency} streams at a time ...")
            run = asyncio.run(run_workload(url, requests, concurrency=s.concurrency, rate=None, stream=True,
                                           ignore_eos=True, duration=s.sizing_seconds, progress=False, label="burst"))
            health = httpx.get(f"{url}/health", timeout=10).status_code
            device_used = _device_memory_used(r.loaded.device)
        output.seek(0)
        log = output.read()
    r.record("sizing", cache=[line for line in log.splitlines() if "cache reserved" in line],
             out_of_memory_in_log="out of memory" in log.lower(), health_after=health,
             device_memory_used_after=device_used, **load_report.summarize(run))


def _device_memory_used(device: torch.device) -> float | None:
    """The fraction of the device's memory in use by every process, as the driver counts it."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return 1 - free / total


def hf_part(r: ShapeRun) -> None:
    if r.shape.family == "bundled":
        r.record("hf", model=None, why_none=f"transformers has no class for Quill's {r.loaded.architecture}")
        return
    hf_model, how = hf_model_for(r.loaded)
    r.record("hf", model=how, max_logit_difference=max_logit_difference(r.loaded, hf_model))
    pad = pad_token_id(r.loaded)
    batch_size = r.options.hf_batch_sizes.get(r.name, r.shape.hf_batch_size)
    static = hf_runs.static_batches(hf_model, r.timed, batch_size, pad)
    r.record("hf", static=static.to_dict(computed_tokens_per_s=static.computed_tokens_per_s))
    r.record("hf", batch1=_median_of_repeats(_batch1_requests(r), lambda q: hf_runs.decode(hf_model, q, pad)))


PARTS = {"engine": engine_part, "batch1": batch1_part, "profile": profile_part, "http": http_part,
         "sizing": sizing_part, "hf": hf_part}


# ---- one shape, then the whole run -------------------------------------------------------


def _free_memory(device: torch.device) -> None:
    """Give back what the last part left behind, before the next one (or the server) needs the memory."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _server_config(s: GpuBenchSettings, loaded: LoadedModel, model_spec: str, requests: list[TokenizedRequest],
                   server_args: list[str]) -> ServerConfig:
    """`quill serve`'s defaults with room for every request at full length (nothing is preempted), then
    `server_args` on top. A model with a state per sequence (slots, or slots beside K,V) gets its slots for every
    running sequence whatever the cache's size: its cache is sized as the server sizes it by default."""
    d = ServerConfig()
    if loaded.model.state_kind == "paged_kv":
        bytes_per_block = loaded.model.new_state(1, block_size=s.block_size).bytes_per_block
        cache_bytes = quill_runs.blocks_needed(requests, s.block_size) * bytes_per_block
    else:
        cache_bytes = None
    base = ServerConfig(
        models=[model_spec], host="127.0.0.1", port=free_port(), device=str(loaded.device),
        dtype=str(loaded.dtype).removeprefix("torch."), block_size=s.block_size,
        max_num_seqs=max(d.max_num_seqs, s.concurrency), max_queue=max(d.max_queue, s.num_requests),
        cache_bytes=cache_bytes,
    )
    return with_serve_args(base, server_args)


def run_shape(name: str, s: GpuBenchSettings, parts: list[str], device: torch.device, dtype: torch.dtype,
              recorder: Recorder, options: RunOptions) -> None:
    """Build the shape's checkpoint, then run `parts` on it; a part's failure is recorded, the next one runs."""
    shape, log = s.shapes[name], options.log
    figures = recorder.results["shapes"].setdefault(name, {"errors": {}, "part_seconds": {}})
    # The server reads the attention backend and layer ops from its flags; the in-process model loads with the same.
    serve = with_serve_args(ServerConfig(cache_bytes=1), options.server_args)
    with tempfile.TemporaryDirectory(prefix=f"quill-gpu-bench-{name}-", dir=options.tmp_dir) as tmp:
        start = time.perf_counter()
        if shape.family == "bundled":
            tmp, source = str(BUNDLED_DIR / shape.config["name"]), f"bundled checkpoint {shape.config['name']}"
        else:
            log(f"{name}: making random weights ({shape.description}) on {device} and saving them ...")
            save_random_model(Path(tmp), shape.family, shape.config, seed=s.seed, device=device, dtype=dtype)
            _free_memory(device)  # the model it made, once saved
            source = f"random weights, {shape.family} family"
        loaded = load_checkpoint(tmp, device=device, dtype=dtype, name=name, attention_backend=serve.attention_backend,
                                 layer_ops=serve.layer_ops)
        figures["model"] = describe_model(loaded, source) | {
            "description": shape.description, "family": shape.family, "config": shape.config,
            "decode_read_bytes": decode_read_bytes(loaded.model),
            "attention_backend": getattr(loaded.model, "attention_backend", None),
        }
        figures["part_seconds"]["checkpoint"] = time.perf_counter() - start
        spec, target = workload_spec(s, name), {name: target_model(loaded)}
        requests = build_requests(spec, target)
        warm_spec = replace(spec, num_requests=s.warmup_requests, max_tokens=(2, 4))
        warm = build_requests(warm_spec, target, salt=1) if s.warmup_requests else []
        server = _server_config(s, loaded, f"{name}={tmp}", tokenize(requests) + tokenize(warm, tag="w"),
                                options.server_args)
        figures["workload"] = spec.describe() | {"concurrency": s.concurrency}
        run = ShapeRun(name, shape, s, options, loaded, requests, warm, server, recorder, figures)
        recorder.save()
        for part in (p for p in PARTS if p in parts):
            log(f"{name}: {part} ...")
            start = time.perf_counter()
            try:
                PARTS[part](run)
            except Exception:
                figures["errors"][part] = traceback.format_exc()
                log(f"{name}: {part} FAILED:\n{figures['errors'][part]}")
            except KeyboardInterrupt:
                figures["errors"][part] = "stopped (a time limit, or Ctrl-C) before the part finished"
                raise
            finally:
                figures["part_seconds"][part] = time.perf_counter() - start
                recorder.save()
                _free_memory(device)


def run(s: GpuBenchSettings, shapes: list[str], parts: list[str], device: str = "auto", dtype: str = "auto",
        out: Path | None = None, options: RunOptions | None = None) -> dict:
    """The whole benchmark (see the module docstring); returns every figure, JSON-ready."""
    import transformers

    options = options or RunOptions()
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    unknown = [name for name in shapes if name not in s.shapes]
    if unknown:
        raise ValueError(f"unknown shapes {unknown} (known: {', '.join(s.shapes)})")
    with_serve_args(ServerConfig(cache_bytes=1), options.server_args)  # a flag the server lacks fails at once
    machine = describe_machine() | {"load_average": load_average(), "transformers": transformers.__version__}
    results = {
        "benchmark": "gpu_bench", "preset": s.name, "command": sys.argv, "device": describe_device(device),
        "dtype": str(dtype).removeprefix("torch."), "machine": machine, "server_args": options.server_args,
        "settings": asdict(replace(s, shapes={k: v for k, v in s.shapes.items() if k in shapes})),
        "parts": [p for p in PARTS if p in parts], "shapes": {},
    }
    recorder = Recorder(results, out, gpu_report.summarize)
    options.log(f"measuring read bandwidth on {device} ...")
    results["limits"] = {"read_bandwidth": read_bandwidth(s.bandwidth_bytes, s.bandwidth_repeats, device),
                         "bandwidth_bytes": s.bandwidth_bytes, "bandwidth_repeats": s.bandwidth_repeats,
                         "bandwidth_how": "best of the repeats: sum of a float32 tensor in the device's memory"}
    recorder.save()
    for name in shapes:
        try:
            run_shape(name, s, parts, device, dtype, recorder, options)
        except Exception:
            results["shapes"].setdefault(name, {"errors": {}})["errors"]["setup"] = traceback.format_exc()
            options.log(f"{name}: FAILED before its parts:\n{results['shapes'][name]['errors']['setup']}")
        finally:
            recorder.save()
            _free_memory(device)
        options.log("\n".join(gpu_report.render_shape(name, results["shapes"][name])))
    machine["load_average_end"] = load_average()
    recorder.save()
    return results


def parse_hf_batch_sizes(text: str, shapes: list[str]) -> dict[str, int]:
    """'64' (every shape) or 'gpt2=128,llama3-8b=64'."""
    try:
        if "=" not in text:
            return {name: int(text) for name in shapes}
        pairs = [item.split("=", 1) for item in text.split(",") if item]
        sizes = {name.strip(): int(size) for name, size in pairs}
    except ValueError:
        raise ValueError(f"--hf-batch-size must be N or SHAPE=N,..., got {text!r}") from None
    if any(size < 1 for size in sizes.values()):
        raise ValueError(f"--hf-batch-size must be positive, got {text!r}")
    return sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_const", dest="preset", const="smoke", default="full",
                        help="seconds on the CPU: tiny models of each family and a handful of requests")
    parser.add_argument("--device", default="auto", help="cuda | cpu | auto (default)")
    parser.add_argument("--dtype", default="auto", help="bfloat16 | float16 | float32 | auto: bfloat16 on a GPU")
    parser.add_argument("--shapes", nargs="+", default=["gpt2", "llama3.2-1b", "llama3-8b"], choices=list(SHAPES),
                        help="model shapes to run, in this order (default: all)")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                        help="parts to run for each shape (always in the order engine batch1 profile http hf)")
    parser.add_argument("--out", type=Path, help="JSON file, rewritten after every figure")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARGS",
                        help="flags for `quill serve` and the in-process engine, e.g. --server-arg=--attention-"
                             "backend=sdpa or --server-arg '--max-num-batched-tokens 4096' (repeatable)")
    parser.add_argument("--hf-batch-size", help="generate() static batch size: N, or SHAPE=N,... (default: 128 for "
                                                "gpt2 and llama3.2-1b, 64 for llama3-8b)")
    parser.add_argument("--tmp-dir", help="where the random checkpoints are written (default: the system's "
                                          "temporary directory; llama3-8b needs 15 GB there)")
    parser.add_argument("--trace-dir", type=Path, help="keep the profile part's Chrome traces here (gzipped)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    server_args = [a for chunk in args.server_arg for a in shlex.split(chunk)]
    sizes = parse_hf_batch_sizes(args.hf_batch_size, args.shapes) if args.hf_batch_size else {}
    options = RunOptions(server_args, sizes, args.tmp_dir, args.trace_dir, args.progress, log)
    results = run(PRESETS[args.preset], args.shapes, args.parts, args.device, args.dtype, args.out, options)
    print(gpu_report.render(results))
    if args.out:
        log(f"wrote {args.out}")
    return results


def failed_parts(results: dict) -> list[str]:
    return [f"{name}: {part}" for name, shape in results["shapes"].items() for part in shape.get("errors", {})]


if __name__ == "__main__":
    sys.exit(1 if failed_parts(main()) else 0)
