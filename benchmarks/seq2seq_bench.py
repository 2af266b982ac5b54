"""Marian translation (an encoder-decoder) served by Quill over HTTP, beside transformers `generate()` and
CTranslate2, on the same weights, thread count and source token ids, side by side in one run.

    python -m benchmarks.seq2seq_bench                                      # the three engines, beams 1 and 4
    python -m benchmarks.seq2seq_bench --engines transformers,ctranslate2  # the baselines alone
    python -m benchmarks.seq2seq_bench --online                            # and Poisson arrivals: Quill vs CT2
    python -m benchmarks.seq2seq_bench --smoke                             # seconds, a tiny Marian: the code runs
    python -m benchmarks.seq2seq_bench --device cuda --dtype bfloat16 --sources 1024 --batch-size 64  # on a GPU

1. Builds OPUS-MT en-de's shape (6+6 layers, d_model 512, 8 heads, ffn 2048, 58,101-token shared vocabulary,
   swish, static sinusoidal positions) with random weights as a Hugging Face directory with a sentencepiece
   tokenizer, and its CTranslate2 float32 conversion, both cached under --cache-dir (common/marian_shape.py).
2. Draws 256 sources of 8-64 token ids (uniform, `</s>` included, last) from the tokenizer's trained pieces, a set
   of its own for each beam width (every engine translates the same set at that width): Quill keeps the encoder
   outputs of sources it has seen for later requests, so a second width on the same sources would skip its
   encoder, which the baselines never do. Its two warm-up requests are drawn apart too.
   Every engine generates exactly 32 new tokens per source (end token barred, never counted), float32, on
   --threads threads (torch.set_num_threads, CTranslate2's intra_threads, `quill serve --threads`).
3. Offline, greedy and beam 4: transformers in static right-padded batches of 32 (torch.inference_mode);
   CTranslate2's translate_batch(max_batch_size=32) over all sources; Quill, all sources sent to /v1/completions
   with 64 in flight (prompt: the ids). Prints tokens/s and sentences/s, and Quill's ratios to both (goals:
   >= 5x transformers, >= 0.7x CTranslate2).
4. --online: greedy requests arriving as a Poisson process at five rates (by default 0.3, 0.6, 0.9, 1.2 and 1.5
   of CTranslate2's offline greedy sentences/s in this run: past the rate it can keep up with, since an engine's
   throughput within a latency budget is only known where a rate exceeds it), 30 s of arrivals each, source
   lengths mixed as above;
   CTranslate2 behind a micro-batching thread (what waited, plus what arrives within 50 ms of the oldest, up to
   32, per translate_batch) against Quill over HTTP, not streamed. p50/p99 latency and throughput per rate; then,
   at CTranslate2's p99 where it kept up, the throughput each reaches (goal: Quill >= 1.5x).

--device cuda runs every engine on the GPU in --dtype (CTranslate2's compute_type of the same name); an engine that
cannot (CTranslate2 without the CUDA libraries it was built for, say) is reported in its own words and left out.

A Quill that refuses the checkpoint (encoder-decoders not served yet, say) is reported in its own words, and the
other engines' figures still print.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .common import seq2seq_http as qh
from .common import seq2seq_runs as runs
from .common.hardware import describe_device, describe_machine, load_average
from .common.marian_shape import OPUS_EN_DE, TINY, MarianShape, Vocab, ensure_ctranslate2, ensure_marian, random_sources
from .common.seq2seq_report import agreement, online_budget, render
from .common.timing import write_json

ENGINES = ("transformers", "ctranslate2", "quill")
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "quill-seq2seq-bench"


@dataclass(frozen=True, slots=True)
class Seq2SeqSettings:
    name: str
    shape: MarianShape = field(default_factory=lambda: OPUS_EN_DE)
    sources: int = 256
    source_lens: tuple[int, int] = (8, 64)  # inclusive, </s> included
    new_tokens: int = 32
    batch_size: int = 32  # transformers' static batches, CTranslate2's max_batch_size and micro-batches
    concurrency: int = 64  # Quill's requests in flight, offline
    seed: int = 0
    rate_fractions: tuple[float, ...] = (0.3, 0.6, 0.9, 1.2, 1.5)  # online: of CTranslate2's offline greedy sentences/s
    rates: tuple[float, ...] | None = None  # online rates, requests/s, instead of the fractions
    online_seconds: float = 30.0  # of arrivals, per rate and engine
    drain_cap: float = 30.0  # seconds after the last arrival that an online run waits for its last answers
    batch_window: float = 0.05  # the micro-batcher waits this long after a batch's oldest request for more
    ready_timeout: float = 600.0


ONLINE_SEQS = 256  # Quill's --max-num-seqs at least (as the full run's 64 requests x 4 beams)
FULL = Seq2SeqSettings("full")
SMOKE = Seq2SeqSettings("smoke", shape=TINY, sources=6, new_tokens=8, batch_size=4, concurrency=4,
                        rates=(20.0, 40.0), online_seconds=1.0, drain_cap=20.0, batch_window=0.02, ready_timeout=120.0)


def _versions(*packages: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in packages:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _parameters(hf_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(hf_dir / "model.safetensors", "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _offline_baselines(s: Seq2SeqSettings, engines, beams, threads, hf_dir, vocab, sources, log, device="cpu",
                       dtype="float32") -> tuple:
    """(figures, outputs, translator): transformers and CTranslate2 offline, by engine and beam width."""
    figures, outputs, translator = {}, {}, None
    if "transformers" in engines:
        model = runs.load_transformers(hf_dir, device, getattr(torch, dtype))
        for b in beams:
            log(f"transformers: {len(sources[b])} sources, beams {b}, static batches of {s.batch_size} ...")
            run, outputs[("transformers", b)] = runs.transformers_offline(model, sources[b], s.new_tokens, b,
                                                                          s.batch_size)
            figures.setdefault("transformers", {})[b] = run.to_dict(batch_size=s.batch_size)
        del model
    if "ctranslate2" in engines:
        try:
            translator = runs.ctranslate2_translator(ensure_ctranslate2(hf_dir, log), threads, device, dtype)
            runs.ctranslate2_batch(translator, vocab, [vocab.to_pieces(sources[beams[0]][0])], 2, 1, 1)
        except (ImportError, RuntimeError, ValueError, OSError) as e:  # not installed, or a CUDA library it needs
            log(f"CTranslate2 cannot run on {device} in {dtype}: {e}")
            figures["ctranslate2"] = {b: {"error": f"CTranslate2 on {device}: {e}"} for b in beams}
            return figures, outputs, None
        for b in beams:
            log(f"CTranslate2: {len(sources[b])} sources, beams {b}, max_batch_size {s.batch_size} ...")
            run, outputs[("ctranslate2", b)] = runs.ctranslate2_offline(translator, vocab, sources[b], s.new_tokens, b,
                                                                        s.batch_size)
            figures.setdefault("ctranslate2", {})[b] = run.to_dict(batch_size=s.batch_size)
    return figures, outputs, translator


def _quill_offline(s, stack, beams, threads, hf_dir, sources, warm, quill_args, log, device="cpu", dtype="float32",
                   ) -> tuple[dict, dict, str | None]:
    """(status, figures by beam width, URL or None)."""
    # The same server whichever widths run: room for every beam of `concurrency` requests at width 4 (and for the
    # online part's queue to run 256 at once), not a cap of 64 sequences when only greedy runs.
    seqs = max(ONLINE_SEQS, s.concurrency * max(beams))
    cache = qh.cache_bytes(seqs, 1, s.source_lens[1], s.new_tokens, s.shape.decoder_layers, s.shape.d_model, 16,
                           getattr(torch, dtype).itemsize)
    try:
        url, command, output = qh.start_quill(stack, hf_dir, "marian", threads, seqs, cache, quill_args,
                                              s.ready_timeout, log, device, dtype)
    except qh.QuillUnavailable as e:
        log(f"Quill did not start: {e.reason}")
        return {"ran": False, "refused": e.refused, "reason": e.reason}, {}, None
    figures, texts = {}, {}
    for b in beams:
        log(f"Quill: {len(sources[b])} sources over HTTP, beams {b}, {s.concurrency} in flight ...")
        try:
            figures[b], texts[b] = qh.quill_offline(url, "marian", sources[b], warm, s.new_tokens, b, s.concurrency)
        except qh.QuillUnavailable as e:
            log(f"Quill, beams {b}: {e.reason}; {output.tail()}")
            figures[b] = {"error": e.reason, "refused": e.refused}
    ran = any("error" not in f for f in figures.values())
    return {"ran": ran, "command": command, "texts": texts}, figures, url


def _online(s: Seq2SeqSettings, rates: list[float], translator, vocab: Vocab, url: str | None, log) -> dict:
    """Each rate: CTranslate2 behind the micro-batcher, then Quill (while its server is up), on the same arrivals."""
    out: dict = {"rates": rates, "runs": {"ctranslate2": [], "quill": []}, "errors": {}}
    for i, rate in enumerate(rates):
        count = max(4, round(rate * s.online_seconds))
        sources = random_sources(vocab, count, s.source_lens, s.seed + 1000 + i)
        offsets = runs.poisson_offsets(rate, count, s.seed + 2000 + i)
        if translator is not None:
            log(f"online, {rate:.2f}/s, {count} requests: CTranslate2 micro-batching ...")
            out["runs"]["ctranslate2"].append(runs.ctranslate2_online(
                translator, vocab, sources, offsets, s.new_tokens, 1, s.batch_window, s.batch_size, s.drain_cap, rate))
        if url is not None and "quill" not in out["errors"]:
            log(f"online, {rate:.2f}/s, {count} requests: Quill over HTTP ...")
            try:
                out["runs"]["quill"].append(qh.quill_online(url, "marian", sources, offsets, s.new_tokens, 1,
                                                            s.drain_cap, rate))
            except qh.QuillUnavailable as e:
                out["errors"]["quill"] = e.reason
    return out | online_budget(out["runs"]["ctranslate2"], out["runs"]["quill"])


def run(s: Seq2SeqSettings, engines: list[str], beams: list[int], threads: int, online: bool = False,
        rates: list[float] | None = None, cache_dir: Path = DEFAULT_CACHE, quill_args: list[str] = (),
        log=print, device: str = "cpu", dtype: str = "float32") -> dict:
    """The whole benchmark (see the module docstring); every figure, JSON-ready."""
    rates = rates or (list(s.rates) if s.rates else None)
    if online and rates is None and ("ctranslate2" not in engines or 1 not in beams):
        raise ValueError("--online without --rates sets its rates from CTranslate2's offline greedy run: keep "
                         "ctranslate2 in --engines and 1 in --beams, or pass --rates")
    torch.set_num_threads(threads)
    machine = describe_machine() | {"load_average": load_average(), **_versions("ctranslate2", "transformers"),
                                    "device": describe_device(torch.device(device))}
    hf_dir = ensure_marian(cache_dir, s.shape, log)
    vocab = Vocab.read(hf_dir)
    sources = {b: random_sources(vocab, s.sources, s.source_lens, s.seed + 100 * (b - 1)) for b in beams}
    warm = random_sources(vocab, 2, s.source_lens, s.seed + 50_000)
    every = [source for b in beams for source in sources[b]]
    results = {"benchmark": "seq2seq_bench", "preset": s.name, "settings": asdict(s), "engines": engines,
               "beams": beams, "threads": threads, "machine": machine,
               "model": {"description": s.shape.describe(), "parameters": _parameters(hf_dir), "dtype": dtype,
                         "directory": str(hf_dir), "real_pieces": len(vocab.real)},
               "workload": {"sources": s.sources, "source_tokens": {b: sum(map(len, sources[b])) for b in beams},
                            "source_lens": [min(map(len, every)), max(map(len, every))],
                            "new_tokens": s.new_tokens, "generated_tokens_per_run": s.sources * s.new_tokens}}
    with ExitStack() as stack:
        figures, outputs, translator = _offline_baselines(s, engines, beams, threads, hf_dir, vocab, sources, log,
                                                          device, dtype)
        url = None
        if "quill" in engines:
            status, figures["quill"], url = _quill_offline(s, stack, beams, threads, hf_dir, sources, warm, quill_args,
                                                           log,
                                                           device, dtype)
            texts = status.pop("texts", {})
            results["quill"] = status
        else:
            texts, results["quill"] = {}, {"ran": False, "refused": False, "reason": "not asked for (--engines)"}
        results["offline"] = figures
        results["agreement"] = agreement(hf_dir, beams, outputs, texts)
        if online:
            if rates is None:
                if "error" in figures["ctranslate2"][1]:
                    raise RuntimeError("--online takes its rates from CTranslate2's offline greedy run, which did not "
                                       f"run ({figures['ctranslate2'][1]['error']}): pass --rates")
                greedy = figures["ctranslate2"][1]["sentences_per_s"]
                rates = [round(f * greedy, 2) for f in s.rate_fractions]
            results["online"] = _online(s, rates, translator, vocab, url, log)
    machine["load_average_end"] = load_average()
    return results


def _list(text: str, kind=str) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seq2seq_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="seconds: a tiny Marian and 6 sources; measures nothing")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"which of {','.join(ENGINES)} (default all)")
    parser.add_argument("--beams", default="1,4", help="beam widths, 1 for greedy (default 1,4)")
    parser.add_argument("--threads", type=int, default=2, help="compute threads of every engine (default 2)")
    parser.add_argument("--sources", type=int, help=f"offline sources (default {FULL.sources})")
    parser.add_argument("--new-tokens", type=int, help=f"tokens generated per source (default {FULL.new_tokens})")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where every engine runs (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="every engine's weights and activations (default float32)")
    parser.add_argument("--batch-size", type=int, help=f"transformers' static batches and CTranslate2's "
                                                       f"max_batch_size (default {FULL.batch_size})")
    parser.add_argument("--concurrency", type=int, help=f"Quill's requests in flight, offline (default "
                                                         f"{FULL.concurrency})")
    parser.add_argument("--online", action="store_true", help="also Poisson arrivals: Quill vs CTranslate2")
    parser.add_argument("--rates", help="online arrival rates, requests/s, e.g. 3,6,9 (default: fractions "
                                        f"{FULL.rate_fractions} of CTranslate2's offline greedy sentences/s)")
    parser.add_argument("--online-seconds", type=float, help=f"arrivals per rate (default {FULL.online_seconds})")
    parser.add_argument("--batch-window", type=float, help=f"micro-batching window, s (default {FULL.batch_window})")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"built models (default {DEFAULT_CACHE})")
    parser.add_argument("--quill-args", default="", help="more `quill serve` flags, as one string")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    engines = _list(args.engines)
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines takes some of {','.join(ENGINES)}, not {args.engines!r}")
    beams = _list(args.beams, int)
    if not beams or min(beams) < 1:
        parser.error("--beams takes widths of 1 and more")
    s = SMOKE if args.smoke else FULL
    changes = {k: v for k, v in (("sources", args.sources), ("new_tokens", args.new_tokens),
                                 ("concurrency", args.concurrency),
                                 ("batch_size", args.batch_size),
                                 ("online_seconds", args.online_seconds), ("batch_window", args.batch_window))
               if v is not None}
    s = replace(s, **changes)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    rates = _list(args.rates, float) if args.rates else None
    if args.online and not (rates or s.rates) and ("ctranslate2" not in engines or 1 not in beams):
        parser.error("--online takes its rates from CTranslate2's offline greedy run: keep ctranslate2 in --engines "
                     "and 1 in --beams, or pass --rates")
    results = run(s, engines, beams, args.threads, args.online, rates, args.cache_dir, args.quill_args.split(), log,
                  args.device, args.dtype)
    print(render(results))
    if args.out:
        write_json(args.out, results)
        log(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
