"""Where an encoder-decoder engine's time goes, in process (no HTTP): the seq2seq benchmark's Marian shape, two
batches of translation requests on different sources run to the end one after the other (the first warms up; the
engine keeps encoder outputs for sources it sees again, which would skip the second's encoder), every step timed,
the second under cProfile.

    python -m benchmarks.seq2seq_engine_profile                                   # CPU, float32, the tiny Marian
    python -m benchmarks.seq2seq_engine_profile --shape opus --device cuda --dtype bfloat16 --requests 256

Prints the steps' count and wall time (median, slowest), tokens/s, and the functions that took the most time, by
their own time and with what they call. On a GPU a step's wall time includes waiting for its kernels.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch

from quill.models.loading.checkpoint import load_checkpoint
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams

from .common.hardware import synchronize
from .common.marian_shape import OPUS_EN_DE, TINY, Vocab, ensure_marian, random_sources

SHAPES = {"tiny": TINY, "opus": OPUS_EN_DE}


def _run(engine: EngineCore, device: torch.device) -> list[float]:
    """Every request to its end; each step's wall time, its device work included."""
    times = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seq2seq_engine_profile",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--requests", type=int, default=256, help="requests, all added at once (default 256)")
    parser.add_argument("--beams", type=int, default=1, help="beam width, 1 for greedy (default 1)")
    parser.add_argument("--max-num-seqs", type=int, help="sequences a step runs at most (default: every beam of "
                                                         "every request at once)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "quill-seq2seq-bench")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    hf_dir = ensure_marian(args.cache_dir, SHAPES[args.shape], print)
    loaded = load_checkpoint(hf_dir, device=args.device, dtype=args.dtype)
    seqs = args.max_num_seqs or args.requests * args.beams
    engine = EngineCore(loaded, EngineConfig(scheduler=SchedulerConfig(max_num_seqs=seqs, max_queue=args.requests),
                                             cache=CacheConfig(cache_bytes=2 * 2**30)))
    vocab = Vocab.read(hf_dir)
    # other sources for the warm-up: the engine keeps the encoder outputs of sources it has seen
    warm, timed = (random_sources(vocab, args.requests, (8, 64), seed) for seed in (1, 0))
    start_token = loaded.model.config.decoder_start_token_id
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True,
                            use_beam_search=args.beams > 1, beam_width=args.beams)

    def add(tag: str, sources: list[list[int]]) -> None:
        for i, source in enumerate(sources):
            engine.add_request(f"{tag}{i}", [start_token], params, encoder_token_ids=source)

    add("warm-up ", warm)
    _run(engine, device)
    hits = engine.cache.encoder.hits
    add("", timed)
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    times = _run(engine, device)
    profile.disable()
    seconds = time.perf_counter() - began
    if engine.cache.encoder.hits != hits:
        raise RuntimeError("a timed source reused an encoder output: the figures would skip its encoder")
    print(f"{args.shape} on {device} in {args.dtype}: {args.requests} requests, beams {args.beams}, "
          f"{args.new_tokens} new tokens each")
    print(f"{len(times)} steps in {seconds:.2f} s (under cProfile): median {statistics.median(times) * 1e3:.1f} ms, "
          f"slowest {max(times) * 1e3:.1f} ms; {args.requests * args.new_tokens / seconds:,.0f} tokens/s")
    for key in ("tottime", "cumtime"):
        pstats.Stats(profile).sort_stats(key).print_stats(args.top)


if __name__ == "__main__":
    main()
