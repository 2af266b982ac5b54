"""What the HTTP server costs on top of its engine, at the speed of a GPU's step: output tokens/s of
the real server against the same engine in-process, with a model that computes nothing.

    python -m benchmarks.server_overhead                           # 256 streams, both engine modes, 3 rounds
    python -m benchmarks.server_overhead --modes process --rounds 1 --num-requests 256 --max-tokens 64

The model is `models.scripted.ScriptedModel` saved as a checkpoint (architecture "scripted", a small
vocabulary): a step costs only the engine's own host work, as a small model's step does on a GPU, so
whatever the server adds (HTTP, SSE, the event loop, the hop to the engine process) shows. Each round
serves the workload over HTTP once per engine mode (`quill serve --engine-process` and
`--no-engine-process`, streamed greedy requests with EOS ignored, sent by `quill bench`'s load generator
from this process), then runs the same requests through an `EngineCore` in-process with the server's
settings. Rounds interleave the runs, so a noisy machine disturbs them alike; medians are reported.
Torch runs one thread everywhere (the model has nothing to parallelise).

Each HTTP run also reports the CPU time its processes spent per output token (the API process, the
engine process, and this process's load generator; Linux only) and SSE events per token: the streams
join the outputs of steps they have not yet read, so a side that falls behind sends fewer, larger events.
`--server-args NAME="FLAGS"` (repeatable) serves every engine mode once per set of `quill serve` flags in
each round, to compare server settings side by side:

    python -m benchmarks.server_overhead --modes process \
        --server-args asyncio="--loop asyncio --http h11" --server-args uvloop="--loop uvloop --http httptools"
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from quill.clients.bench import report as load_report
from quill.models.loading.checkpoint import load_checkpoint, save_checkpoint
from quill.models.families.scripted import ScriptedConfig, ScriptedModel
from quill.models.text.tokenizer import Tokenizer
from quill.server.engine.core import EngineCore

from .common import quill_runs
from .common.checkpoints import build_tokenizer
from .common.hardware import describe_machine, load_average
from .http_bench import send_workload, server_config, workload
from .common.server_process import child_pids, cpu_seconds, server_process, with_serve_args
from .common.settings import HttpBenchSettings
from .common.timing import write_json
from .common.tokenized import tokenize

MODES = {"process": True, "thread": False}  # --modes name -> ServerConfig.engine_process


def save_scripted(directory: str | Path, vocab_size: int) -> Path:
    """A checkpoint of `ScriptedModel` with a byte-level tokenizer of exactly `vocab_size` tokens."""
    tokenizer = Tokenizer(build_tokenizer(vocab_size), eos_token_id=0)
    model = ScriptedModel(ScriptedConfig(vocab_size=vocab_size))
    return save_checkpoint(directory, "scripted", model, tokenizer, dtype=torch.float32)


def http_run(config, s: HttpBenchSettings, warm, requests, extra_args: list[str]) -> dict:
    """One HTTP run: output tokens/s, CPU microseconds per output token of each side (None where unknown), and
    SSE events with text per output token."""
    with server_process(config, s.ready_timeout, threads=1, extra_args=extra_args) as (url, process):
        if warm:
            asyncio.run(send_workload(url, [], warm, s.concurrency, s.duration, progress=False))
        sides = {"api": [process.pid], "engine": child_pids(process.pid)}  # an engine process is the server's child
        before = {side: [cpu_seconds(pid) for pid in pids] for side, pids in sides.items()}
        load_generator = time.process_time()
        result = asyncio.run(send_workload(url, [], requests, s.concurrency, s.duration, progress=False))
        load_generator = time.process_time() - load_generator
        after = {side: [cpu_seconds(pid) for pid in pids] for side, pids in sides.items()}
    summary = load_report.summarize(result)
    tokens = summary["completion_tokens"]
    figures = {"tokens_per_s": summary["output_token_throughput"]}
    for side in sides:
        known = bool(sides[side]) and None not in before[side] + after[side]  # no engine process: a thread
        seconds = sum(a - b for a, b in zip(after[side], before[side])) if known else None
        figures[f"{side}_cpu_us_per_token"] = None if seconds is None else 1e6 * seconds / tokens
    figures["load_generator_cpu_us_per_token"] = 1e6 * load_generator / tokens
    events = sum(len(r.chunk_gaps) + (r.ttft is not None) for r in result.results)
    return figures | {"events_per_token": events / tokens}


def run(s: HttpBenchSettings, modes: list[str], rounds: int, vocab_size: int, server_args: dict[str, str] | None = None,
        log=print) -> dict:
    """`server_args`: name -> `quill serve` flags; every engine mode is served with each (default: none)."""
    server_args = server_args or {"default": ""}
    machine = describe_machine() | {"load_average": load_average()}
    names = {(mode, name): mode if len(server_args) == 1 else f"{mode} {name}" for mode in modes for name in server_args}
    runs: dict[str, list[dict]] = {label: [] for label in names.values()}
    in_process_figures: list[float] = []
    with tempfile.TemporaryDirectory(prefix="quill-server-overhead-") as tmp:
        path = save_scripted(tmp, vocab_size)
        loaded = load_checkpoint(path, device="cpu", dtype="float32", name="scripted")
        _, requests, warm = workload(s, loaded, "scripted")
        timed, warm_ids = tokenize(requests), tokenize(warm, tag="w")
        base = server_config(s, loaded, f"scripted={path}", timed + warm_ids)
        for flags in server_args.values():
            with_serve_args(base, shlex.split(flags))  # an unknown flag stops here, before any server starts
        for i in range(rounds):
            for (mode, name), label in names.items():
                config = replace(base, engine_process=MODES[mode])
                figures = http_run(config, s, warm, requests, shlex.split(server_args[name]))
                runs[label].append(figures)
                cpu = ", ".join(f"{key.split('_cpu')[0]} {value:.1f}" for key, value in figures.items()
                                if key.endswith("_cpu_us_per_token") and value is not None)
                log(f"round {i + 1}: HTTP, engine {label}: {figures['tokens_per_s']:,.0f} tokens/s "
                    f"(CPU us per token: {cpu or 'unknown'}; {figures['events_per_token']:.2f} events per token)")
            engine = EngineCore(loaded, quill_runs.engine_config(base))
            in_process = quill_runs.engine_throughput(engine, timed, warm_ids, s.concurrency)
            in_process_figures.append(in_process.tokens_per_s)
            log(f"round {i + 1}: in-process engine: {in_process.tokens_per_s:,.0f} tokens/s "
                f"(decode step {in_process.decode_step_ms_median:.1f} ms at {in_process.decode_step_batch_median:.0f} "
                "sequences)")
    medians = {label: _medians(figures) for label, figures in runs.items()}
    in_process_median = statistics.median(in_process_figures)
    return {
        "benchmark": "server_overhead", "machine": machine | {"load_average_end": load_average()},
        "workload": {"num_requests": s.num_requests, "concurrency": s.concurrency, "prompt_lens": s.prompt_lens,
                     "max_tokens": s.max_tokens, "mix": s.mix, "vocab_size": vocab_size, "stream": True},
        "server_args": server_args, "rounds": rounds,
        "tokens_per_s": {label: [r["tokens_per_s"] for r in figures] for label, figures in runs.items()}
        | {"in_process": in_process_figures},
        "median_tokens_per_s": {label: m["tokens_per_s"] for label, m in medians.items()}
        | {"in_process": in_process_median},
        "http_runs": runs, "http_medians": medians,
        "http_over_in_process": {label: m["tokens_per_s"] / in_process_median for label, m in medians.items()},
    }


def _medians(figures: list[dict]) -> dict:
    return {key: (statistics.median(values) if None not in (values := [f[key] for f in figures]) else None)
            for key in figures[0]}


def render(results: dict) -> str:
    m = results["median_tokens_per_s"]
    width = max(len(label) for label in results["http_over_in_process"]) + 14
    lines = [f"output tokens/s, median of {results['rounds']} rounds ({results['workload']['concurrency']} streams):",
             f"  {'in-process engine':<{width}} {m['in_process']:>8,.0f}"]
    for label, ratio in results["http_over_in_process"].items():
        h = results["http_medians"][label]
        cpu = "  ".join(f"{side} {h[f'{side}_cpu_us_per_token']:5.1f}" for side in ("api", "engine", "load_generator")
                        if h[f"{side}_cpu_us_per_token"] is not None)
        lines.append(f"  {'HTTP, engine ' + label:<{width}} {m[label]:>8,.0f}   {100 * ratio:5.1f}% of in-process"
                     + (f"   CPU us/token: {cpu}" if cpu else "") + f"   events/token {h['events_per_token']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="process,thread", help="engine modes to serve with: process, thread")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated by every request")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--server-args", action="append", default=[], metavar='NAME="FLAGS"',
                        help="serve once with these `quill serve` flags in each round, under NAME (repeatable)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES) or args.rounds < 1:
        parser.error(f"--modes takes {', '.join(MODES)}; --rounds at least 1")
    server_args = dict(spec.partition("=")[::2] for spec in args.server_args)
    if any(not name for name in server_args) or len(server_args) < len(args.server_args):
        parser.error('--server-args takes NAME="FLAGS", each NAME once')

    torch.set_num_threads(1)
    s = HttpBenchSettings("server_overhead", num_requests=args.num_requests, concurrency=args.concurrency,
                          prompt_lens=(args.prompt_len, args.prompt_len), max_tokens=(args.max_tokens, args.max_tokens),
                          hf_serial_subset=0)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    results = run(s, modes, args.rounds, args.vocab, server_args, log)
    print(render(results))
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
