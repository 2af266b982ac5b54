"""`quill serve`'s CPU thread count on a quiet machine and beside a busy neighbor: fixed counts against the default.

    python -m benchmarks.threads_bench                     # 1 thread, every core, and the default
    python -m benchmarks.threads_bench --threads 1 2 auto --num-requests 8

The server runs http_bench's GPT-2-small shape (32,000-token vocabulary, random weights, float32) and gets
`--num-requests` streamed greedy requests, 4 in flight (prompts of 32-128 token ids, 64 new tokens each,
EOS ignored), once per thread setting on a quiet machine, then again while a neighbor process keeps one core
busy (a Python loop that never sleeps, as another job on the host would). On a shared core OpenMP's barriers
wait for the descheduled thread, so the best fixed count differs between the two cases; the default should
match the best in both. Prints output tokens/s per setting and case.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from quill.clients.bench import report as load_report
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.threads import available_cores

from .common.checkpoints import save_random_gpt2
from .common.hardware import describe_machine, load_average
from .common.report import table
from .common.server_process import running_server
from .common.settings import HTTP_FULL
from .common.tokenized import tokenize
from .http_bench import send_workload, server_config, workload

LOAD = replace(HTTP_FULL, num_requests=16, concurrency=4, max_tokens=(64, 64), warmup_requests=2)


@contextmanager
def busy_neighbor(busy: bool):
    """A process spinning on the CPU for the block's duration (nothing when not `busy`)."""
    if not busy:
        yield
        return
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        process.kill()
        process.wait()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", nargs="+", default=["1", str(available_cores()), "default"],
                        help="settings to compare: a count, auto, or default (no --threads flag)")
    parser.add_argument("--num-requests", type=int, default=LOAD.num_requests)
    args = parser.parse_args(argv)
    s = replace(LOAD, num_requests=args.num_requests)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    machine = describe_machine() | {"load_average": load_average(), "available_cores": available_cores()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="quill-threads-bench-") as tmp:
        save_random_gpt2(tmp, s.gpt2, seed=s.seed)
        loaded = load_checkpoint(Path(tmp), device="cpu", dtype="float32", name="gpt2-random")
        _, requests, warm = workload(s, loaded, "gpt2-random")
        config = server_config(s, loaded, f"gpt2-random={tmp}", tokenize(requests + warm, loaded.tokenizer))
        for busy in (False, True):
            for setting in args.threads:
                flags = [] if setting == "default" else ["--threads", setting]
                log(f"{'busy neighbor' if busy else 'quiet'}, threads {setting} ...")
                with busy_neighbor(busy), running_server(config, s.ready_timeout, None, flags) as url:
                    run = asyncio.run(send_workload(url, warm, requests, s.concurrency, s.duration, False))
                rate = load_report.summarize(run)["output_token_throughput"]
                rows.append({"case": "busy neighbor" if busy else "quiet", "threads": setting, "tokens_per_s": rate})
    print(f"{machine.get('cpu')}, {machine['available_cores']} cores available; load average {machine['load_average']}")
    print("\n".join(table(["case", "--threads", "output tokens/s"],
                          [[r["case"], r["threads"], f"{r['tokens_per_s']:,.1f}"] for r in rows])))
    return rows


if __name__ == "__main__":
    main()
