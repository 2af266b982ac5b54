"""Quill over HTTP against transformers `generate()` on the same weights and machine, side by side in one run.

    python -m benchmarks.http_bench --out runs/http_bench.json    # GPT-2-small shape, 32k vocabulary
    python -m benchmarks.http_bench --smoke                       # seconds, a tiny model: the code runs
    python -m benchmarks.http_bench --model shakespeare-transformer --concurrency 16 --prompts text \\
        --mix greedy=0.4,top_p=0.3,beam=0.1,n2=0.2                # a checkpoint of ours, mixed decoding

1. Builds a random-weight GPT-2-small-shape model with a 32,000-token vocabulary (a Hugging Face
   directory with a byte-level tokenizer, see checkpoints.py), or takes `--model`.
2. Starts the real server on it (`quill serve` on a loopback port, its K,V cache sized to hold the
   whole workload) and sends the workload with `quill bench`'s load generator: 64 streamed greedy
   requests, 64 at a time, prompts of 32-128 token ids, max_tokens 16-128, EOS ignored. Stops the server.
3. Runs the same requests in-process: Quill's engine with the server's settings at the same concurrency
   (the difference is the HTTP layer), and `generate()` in static left-padded batches and one at a time.

Prints a table with the ratios and writes every figure, and the machine, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch

from quill.clients.bench import report as load_report
from quill.clients.bench.runner import RunResult, run_workload
from quill.clients.bench.workload import (BenchRequest, TargetModel, WorkloadSpec, build_requests, make_prompt,
                                          parse_mix, parse_range)
from quill.models.loading.checkpoint import LoadedModel, load_checkpoint, resolve_checkpoint_path
from quill.server.config import ServerConfig
from quill.server.engine.core import EngineCore

from .common import hf_runs, quill_runs, side_by_side
from .common.checkpoints import describe_model, gpt2_source, save_random_gpt2
from .common.hardware import describe_machine, load_average
from .common.hf_models import hf_model_for, max_logit_difference, pad_token_id
from .common.server_process import free_port, running_server, serve_command
from .common.settings import HTTP_FULL, HTTP_PRESETS, HttpBenchSettings
from .common.timing import write_json
from .common.tokenized import TokenizedRequest, spread_subset, tokenize


def workload(
    s: HttpBenchSettings, loaded: LoadedModel, name: str
) -> tuple[WorkloadSpec, list[BenchRequest], list[BenchRequest]]:
    """(spec, timed requests, warm-up requests): the shared workload definition, sized for this model."""
    spec = WorkloadSpec(s.num_requests, s.prompt_lens, s.max_tokens, parse_mix(s.mix), models=[name], seed=s.seed,
                        prompts=s.prompts)
    words = 64  # tokens per word: the same probe prompt `quill bench` sends, counted by the same tokenizer
    per_word = len(loaded.tokenizer.encode(make_prompt(random.Random(12345), words))) / words
    target = {name: TargetModel(loaded.max_seq_len, per_word, loaded.model.config.vocab_size)}
    warm = replace(spec, num_requests=s.warmup_requests, max_tokens=(2, 4)) if s.warmup_requests else None
    return spec, build_requests(spec, target), build_requests(warm, target, salt=1) if warm else []


def server_config(s: HttpBenchSettings, loaded: LoadedModel, model_spec: str,
                  requests: list[TokenizedRequest]) -> ServerConfig:
    """The server's settings: `quill serve`'s defaults, except a K,V cache that holds every request at full
    length (so nothing is preempted) and room for every sequence of `concurrency` requests."""
    widest = max(max(st.options.get("n", 1), st.options.get("beam_width", 1)) for st, _ in parse_mix(s.mix))
    bytes_per_block = loaded.model.new_state(1, block_size=s.block_size).bytes_per_block
    return ServerConfig(
        models=[model_spec], host="127.0.0.1", port=free_port(), device=str(loaded.device),
        dtype=str(loaded.dtype).removeprefix("torch."), block_size=s.block_size,
        max_num_seqs=max(ServerConfig.max_num_seqs, s.concurrency * widest),
        cache_bytes=quill_runs.blocks_needed(requests, s.block_size) * bytes_per_block,
    )


async def send_workload(url: str, warm: list[BenchRequest], requests: list[BenchRequest], concurrency: int,
                        duration: float, progress: bool) -> RunResult:
    """The warm-up requests, then the timed ones, streamed with `concurrency` in flight; all must succeed."""
    if warm:
        result = await run_workload(url, warm, concurrency=min(len(warm), concurrency), rate=None, stream=True,
                                    ignore_eos=True, duration=duration, progress=False, label="warm-up")
        _require_all_ok(result, "warm-up")
    result = await run_workload(url, requests, concurrency=concurrency, rate=None, stream=True, ignore_eos=True,
                                duration=duration, progress=progress, label=f"HTTP, concurrency {concurrency}")
    _require_all_ok(result, "the timed run")
    return result


def _require_all_ok(run: RunResult, what: str) -> None:
    """A failed or cut-off request would make every ratio wrong: stop instead."""
    failed = [r for r in run.results if not r.is_ok]
    if failed or run.num_not_sent:
        first = f"; first: {failed[0].status} {failed[0].error}" if failed else ""
        raise RuntimeError(f"{what}: {len(failed)} requests failed, {run.num_not_sent} not sent{first}")


def _model_dir(s: HttpBenchSettings, model: str | None, tmp: str, log) -> tuple[Path, str, str]:
    """(checkpoint directory, model name, where it came from): `model`, or a random GPT-2 saved into `tmp`."""
    if model is not None:
        path = resolve_checkpoint_path(model)
        return path, path.name, f"checkpoint {path}"
    log(f"building a random GPT-2-shape model ({s.gpt2}) ...")
    save_random_gpt2(tmp, s.gpt2, seed=s.seed)
    return Path(tmp), "gpt2-random", gpt2_source(s.gpt2)


def _in_process(s: HttpBenchSettings, loaded: LoadedModel, hf_model, server: ServerConfig,
                timed: list[TokenizedRequest], warm: list[TokenizedRequest], log) -> tuple:
    """(engine run, static batches, one at a time or None): the HTTP run's requests through the engine (the
    server's settings) and generate(), after the server has stopped, so nothing else competes for the cores."""
    log(f"in-process: Quill's engine, {s.concurrency} at a time ...")
    engine_run = quill_runs.engine_throughput(EngineCore(loaded, quill_runs.engine_config(server)), timed, warm,
                                              s.concurrency)
    pad = pad_token_id(loaded)
    log(f"in-process: HF generate, static batches of {s.batch_size} ...")
    static = hf_runs.static_batches(hf_model, timed, s.batch_size, pad)
    serial = None
    if s.hf_serial_subset:
        subset = spread_subset(timed, s.hf_serial_subset)
        log(f"in-process: HF generate, one at a time, {len(subset)} of the {len(timed)} requests ...")
        serial = hf_runs.serial(hf_model, subset, pad)
    return engine_run, static, serial


def run(s: HttpBenchSettings, model: str | None = None, device: str = "cpu", dtype: str = "float32",
        threads: int | None = None, log=print, progress: bool = True) -> dict:
    """The whole benchmark (see the module docstring); returns every figure, JSON-ready."""
    machine = describe_machine() | {"load_average": load_average()}
    with tempfile.TemporaryDirectory(prefix="quill-http-bench-") as tmp:
        path, name, source = _model_dir(s, model, tmp, log)
        loaded = load_checkpoint(path, device=device, dtype=dtype, name=name)
        if loaded.architecture != "transformer":
            raise ValueError(f"http_bench compares with transformers generate(): it needs a Transformer, and "
                             f"{path} is {loaded.architecture}")
        hf_model, how = hf_model_for(loaded)  # before the server starts: a model it cannot rebuild fails at once
        difference = max_logit_difference(loaded, hf_model)
        spec, requests, warm = workload(s, loaded, name)
        timed, warm_ids = tokenize(requests, loaded.tokenizer), tokenize(warm, loaded.tokenizer, tag="w")
        server = server_config(s, loaded, f"{name}={path}", timed + warm_ids)
        command = ["python", *serve_command(server)[1:]]
        log(f"starting the server: {' '.join(command)}")
        with running_server(server, s.ready_timeout, threads) as url:
            log(f"sending {len(requests)} requests over HTTP, {s.concurrency} at a time ...")
            summary = load_report.summarize(
                asyncio.run(send_workload(url, warm, requests, s.concurrency, s.duration, progress)))
        engine_run, static, serial = _in_process(s, loaded, hf_model, server, timed, warm_ids, log)

    machine["load_average_end"] = load_average()
    return {
        "benchmark": "http_bench", "preset": s.name, "settings": asdict(s), "machine": machine,
        "model": describe_model(loaded, source) | {"name": name, "hf_model": how, "max_logit_difference": difference},
        "workload": spec.describe() | side_by_side.describe_requests(timed),
        "server": {"command": command, "config": asdict(server)},
        "http": summary,
        **side_by_side.compare(summary, engine_run, static, serial),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_const", dest="preset", const="smoke", default="full",
                        help="seconds: a tiny random model and a handful of tokens; checks the code, measures nothing")
    parser.add_argument("--model", help="a Transformer checkpoint directory or bundled name instead of the random "
                                        "GPT-2 (ours are rebuilt as their transformers class for generate())")
    parser.add_argument("--gpt2-vocab", type=int,
                        help=f"vocabulary of the random GPT-2 (default {HTTP_FULL.gpt2['vocab_size']:,})")
    parser.add_argument("--num-requests", type=int)
    parser.add_argument("--concurrency", type=int, help="requests in flight over HTTP and in the engine")
    parser.add_argument("--prompt-len", help="prompt tokens, N or LOW:HIGH")
    parser.add_argument("--max-tokens", help="tokens to generate, N or LOW:HIGH")
    parser.add_argument("--prompts", choices=["ids", "text"], help="token-id prompts (exact lengths) or text")
    parser.add_argument("--mix", help="decoding strategies and weights, as `quill bench --mix` (default greedy)")
    parser.add_argument("--batch-size", type=int, dest="hf_batch_size",
                        help="HF static batch size (default: the concurrency)")
    parser.add_argument("--serial-requests", type=int, dest="hf_serial_subset",
                        help="requests timed one at a time through HF generate (0: skip)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | auto")
    parser.add_argument("--threads", type=int, help="torch threads here and in the server (default: torch's choice)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> HttpBenchSettings:
    s = HTTP_PRESETS[args.preset]
    changes = {k: getattr(args, k) for k in ("num_requests", "concurrency", "prompts", "mix", "hf_batch_size",
                                             "hf_serial_subset", "seed") if getattr(args, k) is not None}
    if args.prompt_len:
        changes["prompt_lens"] = parse_range(args.prompt_len, "--prompt-len")
    if args.max_tokens:
        changes["max_tokens"] = parse_range(args.max_tokens, "--max-tokens")
    if args.gpt2_vocab:
        changes["gpt2"] = s.gpt2 | {"vocab_size": args.gpt2_vocab}
    return replace(s, **changes)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    results = run(settings_from(args), args.model, args.device, args.dtype, args.threads, log, args.progress)
    print(side_by_side.render(results))
    if args.out:
        write_json(args.out, results)
        log(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
