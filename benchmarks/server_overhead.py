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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from clients.bench import report as load_report
from models.checkpoint import load_checkpoint, save_checkpoint
from models.scripted import ScriptedConfig, ScriptedModel
from models.tokenizer import Tokenizer
from server.engine.core import EngineCore

from . import quill_runs
from .checkpoints import build_tokenizer
from .hardware import describe_machine, load_average
from .http_bench import send_workload, server_config, workload
from .server_process import running_server
from .settings import HttpBenchSettings
from .tokenized import tokenize

MODES = {"process": True, "thread": False}  # --modes name -> ServerConfig.engine_process


def save_scripted(directory: str | Path, vocab_size: int) -> Path:
    """A checkpoint of `ScriptedModel` with a byte-level tokenizer of exactly `vocab_size` tokens."""
    tokenizer = Tokenizer(build_tokenizer(vocab_size), eos_token_id=0)
    model = ScriptedModel(ScriptedConfig(vocab_size=vocab_size))
    return save_checkpoint(directory, "scripted", model, tokenizer, dtype=torch.float32)


def run(s: HttpBenchSettings, modes: list[str], rounds: int, vocab_size: int, log=print) -> dict:
    machine = describe_machine() | {"load_average": load_average()}
    figures: dict[str, list[float]] = {mode: [] for mode in modes} | {"in_process": []}
    with tempfile.TemporaryDirectory(prefix="quill-server-overhead-") as tmp:
        path = save_scripted(tmp, vocab_size)
        loaded = load_checkpoint(path, device="cpu", dtype="float32", name="scripted")
        _, requests, warm = workload(s, loaded, "scripted")
        timed, warm_ids = tokenize(requests), tokenize(warm, tag="w")
        base = server_config(s, loaded, f"scripted={path}", timed + warm_ids)
        for i in range(rounds):
            for mode in modes:
                config = replace(base, engine_process=MODES[mode])
                with running_server(config, s.ready_timeout, threads=1) as url:
                    result = asyncio.run(send_workload(url, warm, requests, s.concurrency, s.duration, progress=False))
                figures[mode].append(load_report.summarize(result)["output_token_throughput"])
                log(f"round {i + 1}: HTTP, engine {mode}: {figures[mode][-1]:,.0f} tokens/s")
            engine = EngineCore(loaded, quill_runs.engine_config(base))
            in_process = quill_runs.engine_throughput(engine, timed, warm_ids, s.concurrency)
            figures["in_process"].append(in_process.tokens_per_s)
            log(f"round {i + 1}: in-process engine: {in_process.tokens_per_s:,.0f} tokens/s "
                f"(decode step {in_process.decode_step_ms_median:.1f} ms at {in_process.decode_step_batch_median:.0f} "
                "sequences)")
    medians = {name: statistics.median(values) for name, values in figures.items()}
    return {
        "benchmark": "server_overhead", "machine": machine | {"load_average_end": load_average()},
        "workload": {"num_requests": s.num_requests, "concurrency": s.concurrency, "prompt_lens": s.prompt_lens,
                     "max_tokens": s.max_tokens, "mix": s.mix, "vocab_size": vocab_size, "stream": True},
        "rounds": rounds, "tokens_per_s": figures, "median_tokens_per_s": medians,
        "http_over_in_process": {mode: medians[mode] / medians["in_process"] for mode in modes},
    }


def render(results: dict) -> str:
    m = results["median_tokens_per_s"]
    lines = [f"output tokens/s, median of {results['rounds']} rounds ({results['workload']['concurrency']} streams):",
             f"  in-process engine      {m['in_process']:>10,.0f}"]
    for mode, ratio in results["http_over_in_process"].items():
        lines.append(f"  HTTP, engine {mode:<9} {m[mode]:>10,.0f}   {100 * ratio:5.1f}% of in-process")
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
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES) or args.rounds < 1:
        parser.error(f"--modes takes {', '.join(MODES)}; --rounds at least 1")
    torch.set_num_threads(1)
    s = HttpBenchSettings("server_overhead", num_requests=args.num_requests, concurrency=args.concurrency,
                          prompt_lens=(args.prompt_len, args.prompt_len), max_tokens=(args.max_tokens, args.max_tokens),
                          hf_serial_subset=0)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    results = run(s, modes, args.rounds, args.vocab, log)
    print(render(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
