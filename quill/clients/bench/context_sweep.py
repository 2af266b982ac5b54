"""Per-token decode latency against context length, per hosted model, over HTTP.

One streamed greedy request at a time: a prompt of about T tokens, then `decode_tokens`
new ones; the time from the first token to the last, per token after the first, is a decode
step at context ~T (the first token carries the prefill). The figures therefore include
the server's per-token constant costs (engine step, detokenizer, HTTP) along with the model.

Theory (the survey, sections 3.2, 4.2, 5.2): an LSTM step costs O(N D^2) and a gated-CNN
step O(L K D^2) whatever the context, so their curves should be flat; a Transformer step
attends over all T cached keys, O(L T D) on top of O(L D^2), so its curve should rise with T.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from quill.clients.types import ModelInfo

from .report import percentile
from .runner import http_client, send
from .workload import BenchRequest, make_prompt, strategy

DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

# architecture -> (expected shape, why)
THEORY = {
    "lstm": ("flat", "an LSTM step is O(N D^2) whatever the context (section 3.2)"),
    "gcnn": ("flat", "a gated-CNN step reads a fixed window of k-1 inputs per layer, O(L K D^2) (section 4.2)"),
    "transformer": ("grows",
                    "a Transformer step attends over all T cached keys, O(L T D) more per token (section 5.2)"),
}


@dataclass
class SweepSettings:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    decode_tokens: int = 32
    repeats: int = 3
    tolerance: float = 0.15  # relative change, longest vs shortest context, that counts as "not flat"
    seed: int = 0


def lengths_for(model: ModelInfo, settings: SweepSettings) -> list[int]:
    """The sweep's lengths that fit the model's context with room to decode, plus the longest that fits."""
    cap = (model.max_model_len or max(settings.lengths)) - settings.decode_tokens - 1
    fitting = [n for n in settings.lengths if n <= cap]
    if cap >= 1 and (not fitting or cap > fitting[-1] * 1.2) and cap < max(settings.lengths):
        fitting.append(cap)
    return fitting


async def _measure_point(http, model: ModelInfo, target: int, tokens_per_word: float, settings: SweepSettings,
                         rng: random.Random) -> dict:
    # Time per output token of each request, not the gaps between chunks: a server that joins the tokens
    # of several steps into one chunk (a client or event loop that fell behind) sends fewer chunks.
    per_token, contexts = [], []
    for repeat in range(settings.repeats):
        words = max(1, int(target / tokens_per_word * 0.95))
        for _ in range(4):  # a prompt over the context limit is answered 400: shorten it and try again
            request = BenchRequest(0, model.id, make_prompt(rng, words), target, settings.decode_tokens,
                                   strategy("greedy"), 0.0, settings.seed)
            result = await send(http, request, stream=True, ignore_eos=True, run_start=0.0, into={})
            if result.status != "400":
                break
            words = max(1, int(words * 0.85))
        if not result.is_ok:
            raise RuntimeError(f"{model.id}, context {target}: request failed ({result.status}: {result.error})")
        if result.tpot is not None:
            per_token.append(result.tpot)
        contexts.append(result.prompt_tokens)
    if not per_token:
        raise RuntimeError(f"{model.id}, context {target}: fewer than 2 tokens came back per request")
    ms = [t * 1000 for t in per_token]
    return {"target": target, "context": int(percentile(contexts, 50)), "ms_per_token": percentile(ms, 50),
            "p10_ms": percentile(ms, 10), "p90_ms": percentile(ms, 90), "num_samples": len(ms)}


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - slope * mx, slope


def verdict(architecture: str | None, points: list[dict], tolerance: float) -> dict:
    """Does the measured curve have the shape theory predicts? A straight line through all the points (the
    Transformer's extra cost is linear in T) and its rise from the shortest context to the longest."""
    expected, why = THEORY.get(architecture or "", (None, "no prediction for this architecture"))
    if len(points) < 2:
        return {"expected": expected, "growth": None, "agrees": None, "text": "too few lengths to compare"}
    xs, ys = [p["context"] for p in points], [p["ms_per_token"] for p in points]
    intercept, slope = linear_fit(xs, ys)
    start = intercept + slope * min(xs)
    growth = slope * (max(xs) - min(xs)) / start if start > 0 else float("nan")
    seen = "flat" if abs(growth) <= tolerance else ("grows" if growth > 0 else "falls")
    span = (f"fitted {start:.2f} -> {start * (1 + growth):.2f} ms/token from {min(xs)} to {max(xs)} tokens "
            f"({growth:+.0%}, {slope * 1000:+.2f} ms per 1k tokens of context)")
    out = {"expected": expected, "growth": growth, "slope_ms_per_1k_tokens": slope * 1000, "agrees": None}
    if expected is None:
        return out | {"text": f"{span}; {why}"}
    agrees = seen == expected
    if agrees:
        text = f"{span}: {seen}, as theory says: {why}"
    elif expected == "grows":
        text = (f"{span}: no rise beyond {tolerance:.0%}, where theory predicts one: {why}; at this size and "
                "context the per-token constant (weights O(L D^2), engine, HTTP) hides the attention term")
    else:
        text = f"{span}: {seen}, where theory predicts flat: {why}; look for noise or a length-dependent cost"
    return out | {"agrees": agrees, "text": text}


async def _sweep(url: str, api_key: str | None, models: list[ModelInfo], tokens_per_word: dict[str, float],
                 settings: SweepSettings, progress) -> dict:
    rng = random.Random(settings.seed)
    out = {}
    async with http_client(url, api_key, timeout=600) as http:
        for model in models:
            # Warm-up: the first request of a model pays one-off costs.
            warm = BenchRequest(0, model.id, make_prompt(rng, 8), 8, 4, strategy("greedy"), 0.0, 0)
            await send(http, warm, stream=True, ignore_eos=True, run_start=0.0, into={})
            points = []
            for target in lengths_for(model, settings):
                points.append(await _measure_point(http, model, target, tokens_per_word[model.id], settings, rng))
                progress(model.id, points[-1])
            out[model.id] = {"architecture": model.architecture, "max_model_len": model.max_model_len,
                             "points": points, **verdict(model.architecture, points, settings.tolerance)}
    return out


def run_context_sweep(url: str, models: list[ModelInfo], tokens_per_word: dict[str, float],
                      settings: SweepSettings, api_key: str | None = None, progress=lambda model, point: None) -> dict:
    per_model = asyncio.run(_sweep(url, api_key, models, tokens_per_word, settings, progress))
    return {"decode_tokens": settings.decode_tokens, "repeats": settings.repeats, "tolerance": settings.tolerance,
            "models": per_model}


def format_table(sweep: dict) -> str:
    models = sweep["models"]
    names = list(models)
    targets = sorted({p["target"] for m in models.values() for p in m["points"]})
    width = max([12] + [len(n) + 2 for n in names])
    lines = [
        f"decode latency, ms/token (median time per token after the first; {sweep['decode_tokens']} tokens x "
        f"{sweep['repeats']} requests per point, one request at a time)",
        f"{'context':>8}" + "".join(f"{n:>{width}}" for n in names),
    ]
    for t in targets:
        row = f"{t:>8}"
        for n in names:
            point = next((p for p in models[n]["points"] if p["target"] == t), None)
            row += f"{point['ms_per_token']:>{width}.2f}" if point else f"{'-':>{width}}"
        lines.append(row)
    lines.append("(context: prompt tokens asked for; the JSON has the exact counts the server reported)")
    for n in names:
        lines.append(f"{n} ({models[n]['architecture']}): {models[n]['text']}")
    return "\n".join(lines)
