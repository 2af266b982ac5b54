"""Per-step host overhead of the engine: a decode step's wall time with a model that computes nothing.

    python -m benchmarks.host_overhead                    # 256 running sequences, greedy and sampled
    python -m benchmarks.host_overhead --seqs 64 --steps 100 --vocab 32000
    python -m benchmarks.host_overhead --async-scheduling   # each row also with overlapped scheduling
    python -m benchmarks.host_overhead --context 2048 --states paged_kv --settings greedy   # long contexts

The model is `models.scripted.ScriptedModel` (next-token logits looked up from a table), so what
a step costs is the engine's own work: scheduling, cache bookkeeping, building the step's inputs,
sampling over a small vocabulary, stop rules, detokenization and the per-request outputs. That is
the part of every real step that a GPU cannot speed up. Besides wall time it reports the CPU time
of the stepping thread (torch runs on that thread with --threads 1), which other processes on a
shared machine disturb less.

`--context N` gives every sequence an N-token prompt (block size `--block-size`), so each running
sequence holds about N / block size cache blocks while it decodes: the work that grows with context
length (block tables) shows up in the step's time. The prompts are prefilled before timing starts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.models.families.scripted import ScriptedConfig, ScriptedModel
from quill.models.text.tokenizer import Tokenizer
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams

from .common.checkpoints import build_tokenizer
from .common.hardware import describe_machine

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.9, top_k=50),
}


WARMUP_STEPS = 8  # decode steps after the prefill, before timing
MAX_BATCHED_TOKENS = 8192


def scripted_engine(num_seqs: int, vocab_size: int, state_kind: str, async_scheduling: bool = False,
                    max_seq_len: int = 4096, block_size: int = 16) -> EngineCore:
    tokenizer = Tokenizer(build_tokenizer(vocab_size), eos_token_id=0)
    model = ScriptedModel(ScriptedConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, state_kind=state_kind)).eval()
    loaded = LoadedModel(name="scripted", path=Path("scripted"), architecture="scripted", model=model,
                         tokenizer=tokenizer, eos_token_ids=[0], device=torch.device("cpu"), dtype=torch.float32)
    blocks_per_seq = max(64, -(-max_seq_len // block_size))
    scheduler = SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=MAX_BATCHED_TOKENS, max_queue=num_seqs)
    cache = CacheConfig(block_size=block_size, num_blocks=num_seqs * blocks_per_seq)
    return EngineCore(loaded, EngineConfig(scheduler, cache, async_scheduling=async_scheduling))


def measure(num_seqs: int, steps: int, vocab_size: int, setting: str, state_kind: str = "paged_kv",
            async_scheduling: bool = False, context: int = 32, block_size: int = 16) -> dict:
    """Median wall time of a decode step with `num_seqs` sequences running, after every prompt is in."""
    # The first prompts decode while later ones prefill: none may finish before timing ends.
    prefill_steps = -(-num_seqs * context // MAX_BATCHED_TOKENS) + 1
    max_tokens = prefill_steps + steps + 2 * WARMUP_STEPS
    engine = scripted_engine(num_seqs, vocab_size, state_kind, async_scheduling, context + max_tokens, block_size)
    rng = random.Random(0)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=None, **SETTINGS[setting])
    for i in range(num_seqs):
        engine.add_request(f"r{i}", [rng.randrange(1, vocab_size) for _ in range(context)], params)
    while engine.scheduler.waiting or any(g.seqs[0].num_output_tokens == 0 for g in engine.scheduler.running):
        engine.step()  # prefill every prompt
    for _ in range(WARMUP_STEPS):
        engine.step()
    times, cpu_times = [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.thread_time()
        engine.step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu_start)
        if engine.last_step.num_seqs != num_seqs:
            raise RuntimeError(f"expected {num_seqs} running sequences, the step ran {engine.last_step.num_seqs}")
    if async_scheduling and engine.num_overlapped_steps < steps:
        raise RuntimeError(f"only {engine.num_overlapped_steps} of {steps} decode steps overlapped")
    return {"setting": setting, "state": state_kind, "async_scheduling": async_scheduling, "num_seqs": num_seqs,
            "vocab_size": vocab_size, "context": context, "block_size": block_size,
            "median_ms": 1e3 * statistics.median(times), "p90_ms": 1e3 * sorted(times)[int(0.9 * len(times))],
            "median_cpu_ms": 1e3 * statistics.median(cpu_times)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=1024, help="small by default: sampling compute stays out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--async-scheduling", action="store_true",
                        help="measure every row twice: synchronous, then with overlapped scheduling")
    parser.add_argument("--context", type=int, default=32, help="prompt tokens of every sequence")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--states", default="paged_kv,slots", help="comma-separated: paged_kv, slots")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated: {', '.join(SETTINGS)}")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = describe_machine()
    print(f"machine: {machine.get('cpu')}, torch {torch.__version__}, {args.threads} thread(s)")
    rows = []
    for state_kind in args.states.split(","):
        for setting in args.settings.split(","):
            for overlapped in (False, True) if args.async_scheduling else (False,):
                row = measure(args.seqs, args.steps, args.vocab, setting, state_kind, overlapped, args.context,
                              args.block_size)
                rows.append(row)
                mode = " overlapped" if overlapped else ""
                print(f"{state_kind:9s} {setting:8s}{mode} {row['num_seqs']} seqs of {row['context']}+ tokens: "
                      f"decode step median "
                      f"{row['median_ms']:.2f} ms (p90 {row['p90_ms']:.2f} ms; CPU time of the step's thread "
                      f"{row['median_cpu_ms']:.2f} ms)")
    return rows


if __name__ == "__main__":
    main()
