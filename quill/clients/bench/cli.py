"""`quill bench`: load a running server and report what it did (see `add_bench_parser` for the modes)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import sys
from pathlib import Path

from quill.clients.client import DEFAULT_URL, Client

from . import context_sweep, report
from .runner import run_workload
from .target import hosted_models, model_languages, require_loopback, tokens_per_word
from .workload import TargetModel, WorkloadSpec, build_requests, parse_mix, parse_range

DEFAULT_MIX = "greedy=0.4,top_p=0.3,beam=0.1,n2=0.2"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _codes(text: str) -> list[str]:
    codes = [c.strip() for c in text.split(",") if c.strip()]
    if not codes:
        raise argparse.ArgumentTypeError(f"expected comma-separated language codes, got {text!r}")
    return codes


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="load-test a running server: throughput, TTFT, inter-token and end-to-end latency",
        description="Load-test a running Quill server over HTTP. Modes: one run (default), --sweep over "
                    "concurrencies (PNG plots), and --context-sweep (decode latency against context length). "
                    "The same workload against transformers generate() and the engine in-process, side by side: "
                    "python -m benchmarks.http_bench (in the repository).",
    )
    p.add_argument("--url", default=os.environ.get("QUILL_URL", DEFAULT_URL), help="server URL (env QUILL_URL)")
    p.add_argument("--api-key", default=os.environ.get("QUILL_API_KEY"), help="bearer token (env QUILL_API_KEY)")
    p.add_argument("--allow-remote", action="store_true", help="allow a URL that is not a loopback address")
    p.add_argument("--model", action="append", help="model to load (repeatable; default: every hosted model, "
                                                    "requests round-robin)")
    load = p.add_argument_group("workload")
    load.add_argument("--num-requests", type=int, default=64, help="requests per run")
    load.add_argument("--duration", type=float, default=300.0,
                      help="cap in seconds per run: then running requests are cancelled and the rest not sent")
    load.add_argument("--concurrency", type=int, default=None,
                      help="requests in flight (default 8; with --rate: a cap, none by default)")
    load.add_argument("--rate", type=float, default=None, help="Poisson arrivals at this many requests/s")
    load.add_argument("--prompt-len", default="32:128", help="prompt tokens, N or LOW:HIGH (uniform)")
    load.add_argument("--max-tokens", default="16:128", help="tokens to generate, N or LOW:HIGH (uniform)")
    load.add_argument("--mix", default=DEFAULT_MIX,
                      help="decoding strategies and weights: greedy, sample, temperature, top_k, top_p, min_p, "
                           f"beam (width 4), beamK, nK (K samples) (default {DEFAULT_MIX})")
    load.add_argument("--no-stream", dest="stream", action="store_false", help="plain responses (no TTFT or ITL)")
    load.add_argument("--allow-eos", dest="ignore_eos", action="store_false",
                      help="let requests stop at end-of-sequence (default: exactly max_tokens each)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--source-lang", default=None,
                      help="encoder-decoder models: the source language of every request (default: none sent)")
    load.add_argument("--target-lang", type=_codes, default=None, metavar="L1,L2,...",
                      help="encoder-decoder models: target languages, taken in turn (default: every language the "
                           "model lists, or none for a model that lists none); prompts are their source text")
    load.add_argument("--warmup", type=int, default=4, help="untimed requests before the first run")
    modes = p.add_argument_group("modes")
    modes.add_argument("--sweep", type=_int_list, default=None, metavar="C1,C2,...",
                       help="one run per concurrency, then PNG plots")
    modes.add_argument("--context-sweep", action="store_true",
                       help="decode latency against context length per model (one request at a time), table + PNG")
    modes.add_argument("--context-lengths", type=_int_list, default=list(context_sweep.DEFAULT_LENGTHS),
                       help="prompt lengths for --context-sweep, capped by each model's max_model_len")
    modes.add_argument("--context-decode-tokens", type=int, default=32, help="tokens decoded per context point")
    modes.add_argument("--context-repeats", type=int, default=3, help="requests per context point")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="runs/bench/bench.json", help="JSON result file")
    out.add_argument("--plot-dir", default=None, help="where PNGs go (default: the JSON file's directory)")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(run=run_bench)
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.sweep and args.rate is not None:
        raise ValueError("--sweep varies the concurrency; it cannot be combined with --rate")
    if args.context_sweep and args.sweep:
        raise ValueError("--context-sweep is a mode of its own: run it without --sweep")
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError("--concurrency must be at least 1")
    if args.duration <= 0:
        raise ValueError("--duration must be positive")


def _title(spec: WorkloadSpec, machine: dict) -> str:
    return (f"{', '.join(spec.models)}; {spec.num_requests} requests, "
            f"prompt {spec.prompt_len[0]}-{spec.prompt_len[1]}, max_tokens {spec.max_tokens[0]}-{spec.max_tokens[1]}"
            f"\n{machine['cpu']}, {machine['cores']} cores")


def _decoder_only(models: list, payload: dict) -> list:
    """--context-sweep's models: its curve is decode latency against the decoder's context, set against the
    theory of decoder-only architectures, so encoder-decoders are left out (and said so)."""
    skipped = [m.id for m in models if m.encoder_decoder]
    if skipped:
        print(f"--context-sweep: leaving out the encoder-decoder model(s) {', '.join(skipped)}", file=sys.stderr)
        payload["context_sweep_skipped"] = skipped
    kept = [m for m in models if not m.encoder_decoder]
    if not kept:
        raise ValueError("--context-sweep measures decoder-only models; every model chosen is an encoder-decoder")
    return kept


def _run_context_sweep(args, models, per_word, payload, plot_dir: Path) -> None:
    from . import plots  # matplotlib loads only when a plot is drawn

    settings = context_sweep.SweepSettings(tuple(args.context_lengths), args.context_decode_tokens,
                                           args.context_repeats, seed=args.seed)

    def progress(model, point):
        if args.progress:
            print(f"  {model}: context {point['context']:>5} tokens: {point['ms_per_token']:.2f} ms/token",
                  file=sys.stderr, flush=True)

    sweep = context_sweep.run_context_sweep(args.url, models, per_word, settings, args.api_key, progress)
    print(context_sweep.format_table(sweep))
    curves = {f"{name} ({m['architecture']})": m["points"] for name, m in sweep["models"].items()}
    path = plots.context_sweep_plot(
        curves, plot_dir / "context_sweep.png",
        f"decode latency vs context, over HTTP, one request at a time\n{payload['machine']['cpu']}, "
        f"{payload['machine']['cores']} cores")
    print(f"plot: {path}")
    payload["context_sweep"] = sweep
    payload["plots"] = [str(path)]


def _run_load(args, models, per_word, languages, payload, plot_dir: Path) -> None:
    spec = WorkloadSpec(
        num_requests=args.num_requests, prompt_len=parse_range(args.prompt_len, "--prompt-len"),
        max_tokens=parse_range(args.max_tokens, "--max-tokens"), mix=parse_mix(args.mix),
        models=[m.id for m in models], rate=args.rate, stream=args.stream, ignore_eos=args.ignore_eos, seed=args.seed,
    )
    targets = {m.id: TargetModel(m.max_model_len or 4096, per_word[m.id], encoder_decoder=m.encoder_decoder,
                                 max_source_len=m.max_source_len, source_lang=languages[m.id][0],
                                 target_langs=languages[m.id][1]) for m in models}
    requests = build_requests(spec, targets)
    concurrencies = args.sweep or [args.concurrency or (None if args.rate else 8)]
    payload["workload"] = spec.describe()
    payload["runs"] = []

    def go(reqs, concurrency, label, progress):
        return asyncio.run(run_workload(
            args.url, reqs, concurrency=concurrency, rate=args.rate, stream=spec.stream, ignore_eos=spec.ignore_eos,
            duration=args.duration, api_key=args.api_key, progress=progress, label=label))

    if args.warmup:
        warm = dataclasses.replace(spec, num_requests=args.warmup, rate=None)
        go(build_requests(warm, targets, salt=1), min(args.warmup, 8), "warm-up", False)
    summaries, ttfts = [], {}
    for concurrency in concurrencies:
        run = go(requests, concurrency, f"concurrency {concurrency}" if concurrency else f"{args.rate} req/s",
                 args.progress)
        summary = report.summarize(run)
        summaries.append(summary)
        ttfts[concurrency] = [r.ttft for r in run.results if r.is_ok and not r.answers_at_end and r.ttft is not None]
        print(report.format_summary(summary), end="\n\n", flush=True)
        payload["runs"].append({"summary": summary, "requests": report.request_records(run)})
    if args.sweep:
        from . import plots

        paths = plots.sweep_plots(summaries, ttfts, plot_dir, _title(spec, payload["machine"]))
        payload["plots"] = [str(p) for p in paths]
        print("plots: " + ", ".join(payload["plots"]))


def run_bench(args: argparse.Namespace) -> int:
    require_loopback(args.url, args.allow_remote)  # before anything is sent
    _check_args(args)
    out = Path(args.out)
    plot_dir = Path(args.plot_dir) if args.plot_dir else out.parent
    payload = {
        "quill_bench": 1, "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "url": args.url, "machine": report.machine(),
        "arguments": {k: v for k, v in vars(args).items() if k not in ("run", "api_key", "command")},
    }
    with Client(args.url, api_key=args.api_key, max_retries=0) as client:
        models = hosted_models(client, args.model)
        if args.context_sweep:
            models = _decoder_only(models, payload)
        payload["models"] = [vars(m) for m in models]
        languages = {m.id: model_languages(m, args.source_lang, args.target_lang) for m in models}
        if (args.source_lang or args.target_lang) and not any(m.encoder_decoder for m in models):
            raise ValueError("--source-lang and --target-lang are for encoder-decoder models, and none of "
                             f"{', '.join(m.id for m in models)} is one")
        per_word = {m.id: tokens_per_word(client, m, languages[m.id][0], next(iter(languages[m.id][1]), None))
                    for m in models}
    payload["tokens_per_word"] = per_word
    # what each encoder-decoder model's requests carry: the report names them
    payload["languages"] = {m.id: {"source_lang": languages[m.id][0], "target_langs": list(languages[m.id][1])}
                            for m in models if m.encoder_decoder}
    if args.context_sweep:
        _run_context_sweep(args, models, per_word, payload, plot_dir)
    else:
        _run_load(args, models, per_word, languages, payload, plot_dir)
    print(f"results: {report.write_json(out, payload)}")
    # Non-zero when a request failed; requests cut off by the duration cap are not failures.
    failed = any(set(r["summary"]["errors_by_status"]) - {"cancelled"} for r in payload.get("runs", []))
    return 1 if failed else 0
