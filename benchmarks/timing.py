"""Result records shared by the Quill and Hugging Face runs."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass


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
