"""Result records shared by the Quill and Hugging Face runs, and the timing and writing the benchmarks share."""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .hardware import synchronize


@dataclass(slots=True)
class TimedRun:
    """Requests served and how long they took, start of the first to end of the last."""

    num_requests: int
    generated_tokens: int
    prompt_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds

    def to_dict(self, **extra) -> dict:
        """Every field, the rate, and `extra`: JSON-ready."""
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, **extra}


def inter_token_ms(timestamps: list[float]) -> list[float]:
    """Milliseconds between consecutive tokens; timestamps[0] is when the first token arrived."""
    return [1000 * (b - a) for a, b in zip(timestamps, timestamps[1:])]


@dataclass(slots=True)
class DecodeTiming:
    """One request decoded alone, medians over repeats."""

    ms_per_token: float  # median gap between consecutive generated tokens (prefill excluded)
    first_token_ms: float  # start to first token: the prompt's prefill
    total_s: float
    repeats: int

    @classmethod
    def from_runs(cls, runs: list[tuple[float, list[float]]]) -> "DecodeTiming":
        """runs: (start time, token arrival times) of each repeat."""
        return cls(
            ms_per_token=statistics.median(statistics.median(inter_token_ms(ts)) for _, ts in runs),
            first_token_ms=statistics.median(1000 * (ts[0] - start) for start, ts in runs),
            total_s=statistics.median(ts[-1] - start for start, ts in runs),
            repeats=len(runs),
        )


def interleaved_times(contenders: dict, repeats: int, device: torch.device = torch.device("cpu"),
                      warmup: bool = True) -> dict[str, dict[str, list[float]]]:
    """name -> {"wall": seconds, "cpu": process CPU seconds} of each repeat. The contenders run in turn each
    repeat, so that other work on a shared machine slows them alike; CPU time is what that work moves less. First
    one untimed call each (first calls are slow) unless `warmup` is False, for callers that already made one."""
    if warmup:
        for fn in contenders.values():
            fn()
    times = {name: {"wall": [], "cpu": []} for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            synchronize(device)  # a GPU's kernels run after the call returns
            times[name]["wall"].append(time.perf_counter() - start)
            times[name]["cpu"].append(time.process_time() - start_cpu)
    return times


def write_json(path: Path | None, results: dict) -> None:
    """The results as indented JSON at `path`, its folder made if missing (None, as when --out is not given:
    nowhere)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def in_turn(contenders: Sequence, repeat: int) -> Sequence:
    """The contenders in the order they run in repeat `repeat`: reversed every other repeat, so that none is always
    first (the process's or the machine's first run pays for what the others reuse)."""
    return contenders if repeat % 2 == 0 else contenders[::-1]


def interleaved_runs(contenders: dict, repeats: int, log, describe) -> dict[str, list]:
    """name -> the results (dicts) of each repeat, the contenders called in turn every repeat, each result logged
    with `describe` and given the minor page faults its call took. Every other repeat calls them in reverse order:
    the process's first call touches its memory for the first time (an xLSTM run's first contender took 240,532
    page faults, the same call in the next repeat 34), so no contender is always the one that pays for it."""
    results: dict[str, list] = {name: [] for name in contenders}
    for repeat in range(repeats):
        for name, fn in in_turn(list(contenders.items()), repeat):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            results[name].append(fn())
            # memory the process had to map afresh: glibc hands large freed blocks back to the OS (benchmarks/README.md)
            results[name][-1]["minor_page_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            log(f"  repeat {repeat + 1}/{repeats}: {name}: {describe(results[name][-1])}")
    return results
