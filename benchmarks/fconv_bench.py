"""fairseq's fconv_lm at the published WikiText-103 shape, random weights, through the in-process engine:
tokens/s with many concurrent requests against one request at a time; greedy requests at 64 concurrent
with the adaptive softmax's exact greedy shortlist (the engine asks for it) and with the full distribution
(`cheap_argmax` off), interleaved; what the shortlist saves alone; and the model's decode step alone.

    python -m benchmarks.fconv_bench --out fconv.json      # ~5-8 min on 2 cores
    python -m benchmarks.fconv_bench --greedy-only         # only the greedy comparison
    python -m benchmarks.fconv_bench --scale 8             # widths and vocabulary / 8: under a minute
    python -m benchmarks.fconv_bench --smoke               # seconds: checks that it runs, measures nothing

The shape is `fconv_lm_dauphin_wikitext103`'s: embed 280, 14 gated convolutions of 850-2048 maps
(kernels 1-6), adaptive softmax with cutoffs 10000, 20000, 200000 over 267,744 words.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import LoadedModel
from quill.models.classic.fairseq_dictionary import dictionary_tokenizer
from quill.models.classic.literal_expression import literal_expression
from quill.models.families.fconv import FConvConfig, FConvLanguageModel
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams

from .common.hardware import describe_machine, load_average
from .common.timing import write_json

WIKITEXT103_LAYERS = ("[(850, 6)] * 3 + [(850, 1)] + [(850, 5)] * 4 + [(850, 1)] + [(850, 4)] * 3"
                      " + [(1024, 4)] + [(2048, 4)]")
WIKITEXT103_VOCAB = 267_744


def wikitext103_config(scale: int = 1) -> FConvConfig:
    """The published shape; `scale` > 1 divides every width and the vocabulary (for a quick check)."""
    layers = [[max(out // scale, 4), k, 1] for out, k in literal_expression(WIKITEXT103_LAYERS)]
    vocab = WIKITEXT103_VOCAB // scale
    cutoff = [10000 // scale, 20000 // scale, 200000 // scale, vocab]
    last = layers[-1][0]
    return FConvConfig(vocab_size=vocab, embed_dim=280 // scale, layers=layers, adaptive_softmax_cutoff=cutoff,
                       adaptive_softmax_dims=[max(last // 4 ** i, 1) for i in (1, 2, 3)])


def random_model(config: FConvConfig) -> FConvLanguageModel:
    torch.manual_seed(0)
    model = FConvLanguageModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=1.0 / p.shape[-1] ** 0.5)
    return model.eval().requires_grad_(False)


def timed_engine_run(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int, concurrency: int,
                     temperature: float = 1.0) -> float:
    """Generated tokens per second, `concurrency` requests at a time."""
    engine = EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=concurrency, max_num_batched_tokens=2048),
                                             CacheConfig(block_size=16, num_blocks=64)))
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True)
    generated, start = 0, time.perf_counter()
    for first in range(0, len(prompts), concurrency):
        for i, prompt in enumerate(prompts[first:first + concurrency]):
            engine.add_request(f"r{first + i}", prompt, params)
        while engine.has_work():
            generated += sum(len(c.token_ids) for out in engine.step() for c in out.outputs)
    return generated / (time.perf_counter() - start)


def decode_step_ms(model: FConvLanguageModel, rows: int, repeats: int, argmax_only: bool = False) -> float:
    """Median milliseconds of the model's decode step alone (one new token for each of `rows` sequences);
    `argmax_only`: every row asks for its argmax alone, as plain greedy requests' rows do."""
    state = model.new_state(rows)
    batch = StepBatch.build([[5]] * rows, [10] * rows, slots=list(range(rows)))
    if argmax_only:
        batch.argmax_only = torch.ones(rows, dtype=torch.bool)
    model.step(batch, state)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.step(batch, state)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def softmax_ms(model: FConvLanguageModel, rows: int, repeats: int) -> dict:
    """Milliseconds for the full log-distribution and for the exact greedy pick, over `rows` hidden states."""
    torch.manual_seed(1)
    h, _ = model._run(torch.randint(4, model.config.vocab_size, (rows, 8)),
                      model._zero_histories(rows, model.embed_tokens.weight))
    h = h[:, -1]
    out = {}
    for name, fn in (("full_ms", model.adaptive_softmax.log_probs), ("greedy_ms", model.adaptive_softmax.greedy)):
        times = []
        with torch.inference_mode():
            for _ in range(repeats):
                start = time.perf_counter()
                fn(h)
                times.append(1000 * (time.perf_counter() - start))
        out[name] = statistics.median(times)
    return out


def greedy_tokens_per_s(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int, shortlist: bool) -> float:
    """Greedy tokens/s, all `prompts` at once; `shortlist` False makes the engine ask for every full distribution."""
    loaded.model.cheap_argmax = shortlist  # read when the engine's runner is built
    try:
        return timed_engine_run(loaded, prompts, max_tokens, len(prompts), temperature=0.0)
    finally:
        loaded.model.cheap_argmax = True


def run(scale: int, repeats: int, log=print, greedy_only: bool = False) -> dict:
    config = wikitext103_config(scale)
    model = random_model(config)
    log(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
    words = [f"w{i}" for i in range(config.vocab_size - 4)]
    tokenizer = dictionary_tokenizer(["<s>", "<pad>", "</s>", "<unk>"] + words)
    loaded = LoadedModel("fconv-wt103-random", None, "fconv", model, tokenizer, [2], torch.device("cpu"),
                         torch.float32)
    g = torch.Generator().manual_seed(0)
    prompt_len, max_tokens = 16, 32
    batched_prompts = [[2] + torch.randint(4, config.vocab_size, (prompt_len - 1,), generator=g).tolist()
                       for _ in range(64)]
    results = {"machine": describe_machine() | {"load_average": load_average()}, "scale": scale,
               "prompt_tokens": prompt_len, "max_tokens": max_tokens, "concurrent": 64, "sequential_requests": 4}
    timed_engine_run(loaded, batched_prompts[:2], 4, 2)  # warm-up
    greedy = {"greedy_shortlist_tokens_per_s": [], "greedy_full_tokens_per_s": []}
    for r in range(repeats):  # interleaved, so that drift in the machine's load reaches both alike
        greedy["greedy_shortlist_tokens_per_s"].append(greedy_tokens_per_s(loaded, batched_prompts, max_tokens, True))
        greedy["greedy_full_tokens_per_s"].append(greedy_tokens_per_s(loaded, batched_prompts, max_tokens, False))
        log(f"repeat {r}: greedy at 64, {greedy['greedy_shortlist_tokens_per_s'][-1]:.1f} tok/s with the shortlist, "
            f"{greedy['greedy_full_tokens_per_s'][-1]:.1f} tok/s with full distributions")
    results |= greedy
    shortlist_median = statistics.median(greedy["greedy_shortlist_tokens_per_s"])
    full_median = statistics.median(greedy["greedy_full_tokens_per_s"])
    results |= {"greedy_shortlist_median": shortlist_median, "greedy_full_median": full_median,
                "greedy_ratio": shortlist_median / full_median}
    results["greedy_decode_step_ms"] = {name: decode_step_ms(model, 64, 8, argmax_only=quick)
                                        for name, quick in (("shortlist", True), ("full", False))}
    if greedy_only:
        results["machine"]["load_average_end"] = load_average()
        return results
    figures = {"concurrent_tokens_per_s": [], "sequential_tokens_per_s": []}
    for r in range(repeats):
        figures["concurrent_tokens_per_s"].append(timed_engine_run(loaded, batched_prompts, max_tokens, 64))
        figures["sequential_tokens_per_s"].append(timed_engine_run(loaded, batched_prompts[:4], max_tokens, 1))
        log(f"repeat {r}: {figures['concurrent_tokens_per_s'][-1]:.1f} tok/s at 64, "
            f"{figures['sequential_tokens_per_s'][-1]:.1f} tok/s one at a time")
    results |= figures
    concurrent = statistics.median(figures["concurrent_tokens_per_s"])
    sequential = statistics.median(figures["sequential_tokens_per_s"])
    results |= {"concurrent_median": concurrent, "sequential_median": sequential, "ratio": concurrent / sequential}
    results["decode_step_ms"] = {rows: decode_step_ms(model, rows, 8) for rows in (1, 64)}
    results["adaptive_softmax"] = {rows: softmax_ms(model, rows, 5) for rows in (1, 64)}
    results["machine"]["load_average_end"] = load_average()
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fconv_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=1, help="divide every width and the vocabulary by this")
    parser.add_argument("--smoke", action="store_true", help="--scale 64 --repeats 1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--greedy-only", action="store_true", help="only greedy with and without the shortlist")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = run(64, 1, greedy_only=args.greedy_only) if args.smoke else run(args.scale, args.repeats,
                                                                                greedy_only=args.greedy_only)
    print(json.dumps({k: v for k, v in results.items() if k != "machine"}, indent=2))
    print(f"greedy at 64 concurrent: {results['greedy_shortlist_median']:.1f} tok/s with the exact shortlist, "
          f"{results['greedy_full_median']:.1f} tok/s with full distributions: x{results['greedy_ratio']:.2f}; decode "
          f"step of 64 rows {results['greedy_decode_step_ms']['shortlist']:.0f} against "
          f"{results['greedy_decode_step_ms']['full']:.0f} ms")
    if not args.greedy_only:
        machine = results["machine"]
        print(f"{results['concurrent_median']:.1f} tok/s at 64 concurrent, {results['sequential_median']:.1f} tok/s "
              f"one at a time: x{results['ratio']:.1f} on {machine['cpu']} ({machine['cores']} cores)")
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
