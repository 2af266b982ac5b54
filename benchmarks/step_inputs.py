"""The runner's host time building a step's inputs, in the steady state and when sequences come and go.

    python -m benchmarks.step_inputs                       # 256 sequences, synchronous then overlapped
    python -m benchmarks.step_inputs --seqs 64 --steps 200

With `--seqs` sequences decoding (the scripted model of benchmarks/host_overhead.py: no compute), two runs:
- steady: every sequence keeps decoding; every step decodes the same sequences again;
- churn: one sequence finishes every step and a new request (an 8-token prompt) is admitted in its place, so
  every step has one sequence fewer than the one before, one new prompt, and one new decoder (the prompt of the
  step before).
The figure is the CPU time of the stepping thread from the moment the engine hands the runner its batch
(`ModelRunner.launch`) to the moment the model's step is called: packing the inputs, planning sampling and
uploading them, not the forward pass, the sampler or the read-out. Medians over `--steps` steps.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from quill.server.sampling import SamplingParams

from .common.hardware import describe_machine
from .host_overhead import WARMUP_STEPS, scripted_engine

PROMPT_TOKENS, NEW_PROMPT_TOKENS = 32, 8
FIRST_FINISH = 40  # steps before the first sequence finishes (then one a step)


def measure(num_seqs: int, steps: int, vocab_size: int, churn: bool, async_scheduling: bool) -> dict:
    engine = scripted_engine(num_seqs, vocab_size, "paged_kv", async_scheduling, 4096, 16)
    runner, model = engine.runner, engine.runner.model
    spent: list[float] = []
    started = [None]
    launch, model_step = runner.launch, model.step

    def timed_launch(*args, **kwargs):
        started[0] = time.thread_time()
        return launch(*args, **kwargs)

    def timed_step(*args, **kwargs):
        if started[0] is not None:  # the first forward pass of the launch ends its input building
            spent.append(time.thread_time() - started[0])
            started[0] = None
        return model_step(*args, **kwargs)

    runner.launch, model.step = timed_launch, timed_step
    rng = random.Random(0)

    def add(request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        prompt = [rng.randrange(1, vocab_size) for _ in range(prompt_tokens)]
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0))

    for i in range(num_seqs):  # with churn, sequence i finishes after FIRST_FINISH + i tokens
        add(f"r{i}", PROMPT_TOKENS, FIRST_FINISH + i if churn else 10**6)
    while len(engine.scheduler.running) < num_seqs or any(
            g.seqs[0].num_output_tokens == 0 for g in engine.scheduler.running):
        engine.step()
    new_ids = iter(range(num_seqs, 10**9))

    def step() -> None:
        if churn and len(engine.scheduler.waiting) < 2:  # one finishes a step: keep one waiting to take its place
            add(f"r{next(new_ids)}", NEW_PROMPT_TOKENS, 10**6)
        engine.step()

    for _ in range(FIRST_FINISH + WARMUP_STEPS):
        step()
    spent.clear()
    for _ in range(steps):
        step()
    return {"run": "churn" if churn else "steady", "async_scheduling": async_scheduling, "num_seqs": num_seqs,
            "steps": len(spent), "input_ms_median": 1e3 * statistics.median(spent),
            "input_ms_p90": 1e3 * sorted(spent)[int(0.9 * len(spent))]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_inputs", description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"machine: {describe_machine().get('cpu')}, torch {torch.__version__}, {args.threads} thread(s)")
    rows = []
    for async_scheduling in (False, True):
        for churn in (False, True):
            row = measure(args.seqs, args.steps, args.vocab, churn, async_scheduling)
            rows.append(row)
            mode = "overlapped" if async_scheduling else "synchronous"
            print(f"{mode:11s} {row['run']:6s} {row['num_seqs']} seqs: input building median "
                  f"{row['input_ms_median']:.3f} ms (p90 {row['input_ms_p90']:.3f} ms) over {row['steps']} steps")
    return rows


if __name__ == "__main__":
    main()
