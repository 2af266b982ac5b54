"""What a coverage penalty does to beam search on the bundled restoration models (a line lowercased and stripped of
punctuation -> the line as printed: every source word should be attended to about once), beside plain beams, on
the held-out lines `quill train --evaluate-only` scores.

    python -m benchmarks.coverage_restoration                           # beam 4; wu and summary at a few betas
    python -m benchmarks.coverage_restoration --lines 100 --betas 0.2   # quicker

Each setting restores every line through Quill's engine (quill/models/training/evaluate_restoration.py) and is
scored by sacrebleu (13a, case-sensitive) and exact match against the printed lines.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.training.evaluate_restoration import restore, score
from quill.models.training.restoration_pipeline import prepare_restoration

MODELS = ("shakespeare-restore-transformer", "shakespeare-restore-fconv", "shakespeare-restore-lstm")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coverage_restoration",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--lines", type=int, default=500, help="held-out lines scored (default 500)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.1, 0.2, 0.4])
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="corpus cache (quill train's)")
    args = parser.parse_args(argv)
    pairs = prepare_restoration(args.data_dir).evaluation_pairs(args.lines)
    sources, references = [p.source for p in pairs], [p.target for p in pairs]
    settings = [("plain", {})] + [(f"{kind} {beta}", {"coverage_penalty": beta, "coverage_penalty_type": kind})
                                  for kind in ("wu", "summary") for beta in args.betas]
    print(f"{len(pairs)} held-out lines, beam {args.beam}")
    print(f"{'model':34} {'setting':12} {'BLEU':>6} {'exact':>7} {'seconds':>8}")
    for name in args.models:
        loaded = load_checkpoint(name, device="cpu", dtype="float32")
        for label, options in settings:
            started = time.perf_counter()
            scores = score(restore(loaded, sources, args.beam, **options), references)
            print(f"{name:34} {label:12} {scores['bleu']:6.2f} {scores['exact_match']:7.1%} "
                  f"{time.perf_counter() - started:8.1f}", flush=True)


if __name__ == "__main__":
    main()
