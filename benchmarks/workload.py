"""The requests every side of the benchmark serves: fixed-seed prompt and output lengths."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int  # generated exactly (greedy, EOS ignored)


def make_workload(
    num_requests: int, prompt_lens: tuple[int, int], max_tokens: tuple[int, int], vocab_size: int, seed: int
) -> list[BenchRequest]:
    """Random prompts (no two share a prefix, so prefix caching cannot help) with mixed lengths."""
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        prompt = [rng.randrange(1, vocab_size) for _ in range(rng.randint(*prompt_lens))]  # id 0 is EOS
        requests.append(BenchRequest(f"s{seed}-r{i}", prompt, rng.randint(*max_tokens)))
    return requests


def spread_subset(requests: list[BenchRequest], count: int) -> list[BenchRequest]:
    """`count` requests spread evenly over the range of max_tokens, so a timed subset is representative."""
    if count >= len(requests):
        return list(requests)
    ranked = sorted(requests, key=lambda r: (r.max_tokens, len(r.prompt_token_ids)))
    step = len(ranked) / count
    return [ranked[int(step * i + step / 2)] for i in range(count)]


def num_generated(requests: list[BenchRequest]) -> int:
    return sum(r.max_tokens for r in requests)


def num_prompt_tokens(requests: list[BenchRequest]) -> int:
    return sum(len(r.prompt_token_ids) for r in requests)
