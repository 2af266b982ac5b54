"""The shared workload (`clients.bench.workload`) as token ids, for the runs that skip HTTP.

Text prompts are encoded with the model's own tokenizer, as the server encodes them, so the
in-process engine and transformers `generate()` see exactly the prompts the server was sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from quill.clients.bench.workload import BenchRequest


@dataclass(frozen=True, slots=True)
class TokenizedRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int  # generated exactly by every returned sequence (EOS ignored)
    options: dict  # the strategy's client options: temperature, top_p, beam_width, n, ...
    seed: int | None = None  # sampling seed, as sent over HTTP (beam search has none)

    @property
    def num_returned(self) -> int:
        """Sequences that come back (beam search returns n too), as the server's usage counts them."""
        return self.options.get("n", 1)

    @property
    def setting(self) -> str:
        """Requests of one decoding setting can share a static batch."""
        return repr(sorted(self.options.items()))


def tokenize(requests: list[BenchRequest], tokenizer=None, tag: str = "r") -> list[TokenizedRequest]:
    """Id prompts pass through; text prompts need the model's tokenizer. Ids are `{tag}{index}`."""
    out = []
    for r in requests:
        if isinstance(r.prompt, str):
            if tokenizer is None:
                raise ValueError("text prompts need the model's tokenizer")
            ids = tokenizer.encode(r.prompt)
        else:
            ids = list(r.prompt)
        seed = None if "beam_width" in r.strategy.options else r.seed
        out.append(TokenizedRequest(f"{tag}{r.index}", ids, r.max_tokens, dict(r.strategy.options), seed))
    return out


def num_generated(requests: list[TokenizedRequest]) -> int:
    return sum(r.max_tokens * r.num_returned for r in requests)


def num_prompt_tokens(requests: list[TokenizedRequest]) -> int:
    return sum(len(r.prompt_token_ids) for r in requests)


def spread(items: list, count: int) -> list:
    """`count` of `items` spread evenly over them, in order (all of them when there are no more)."""
    if count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[int(step * i + step / 2)] for i in range(count)]


def spread_subset(requests: list[TokenizedRequest], count: int) -> list[TokenizedRequest]:
    """`count` requests spread evenly over the range of max_tokens, so a timed subset is representative."""
    if count >= len(requests):
        return list(requests)  # in their own order, not ranked
    return spread(sorted(requests, key=lambda r: (r.max_tokens, len(r.prompt_token_ids))), count)


def one_per_setting(requests: list[TokenizedRequest], max_tokens: int = 2) -> list[TokenizedRequest]:
    """Short warm-up requests, one per decoding setting: the first call of a code path is slow."""
    seen: dict[str, TokenizedRequest] = {}
    for r in requests:
        seen.setdefault(r.setting, TokenizedRequest(f"warmup-{len(seen)}", r.prompt_token_ids[:8], max_tokens,
                                                    r.options, r.seed))
    return list(seen.values())
