"""The bundled language models' held-out perplexity in float32 and in bfloat16 on the CPU: what `--dtype auto`
costs in quality where it picks bfloat16.

    python -m benchmarks.dtype_perplexity                        # the three bundled BPE language models
    python -m benchmarks.dtype_perplexity --models shakespeare-lstm --data-dir data

Each model is loaded twice as `quill serve` loads it (`load_checkpoint`, the CPU's layer ops), and scored over the
held-out plays its training split kept apart (`quill train`'s corpus, fetched into `--data-dir` once), in windows
of 256 tokens, every token predicted once (quill/models/training/evaluation.py).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from quill.models.loading.checkpoint import load_checkpoint, resolve_checkpoint_path
from quill.models.training.bpe import encode_documents
from quill.models.training.corpus import load_shakespeare
from quill.models.training.evaluation import perplexity

from .common.hardware import describe_machine
from .common.report import table
from .common.timing import write_json

MODELS = ["shakespeare-transformer", "shakespeare-lstm", "shakespeare-gcnn"]
DTYPES = ["float32", "bfloat16"]
CONTEXT = 256


def score(model: str, documents: list[str]) -> dict:
    path = resolve_checkpoint_path(model)
    row, ids = {"model": model}, None
    for dtype in DTYPES:
        loaded = load_checkpoint(path, device="cpu", dtype=dtype, name=model)
        if ids is None:  # the tokenizer is the checkpoint's, whatever the dtype
            ids = torch.from_numpy(encode_documents(loaded.tokenizer.hf, documents))
        started = time.perf_counter()
        with torch.inference_mode():
            row[dtype] = perplexity(loaded.model, ids, CONTEXT)
        row[f"{dtype}_seconds"] = time.perf_counter() - started
    return row | {"tokens": ids.numel()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dtype_perplexity", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="where `quill train` keeps its corpus")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    documents = list(load_shakespeare(args.data_dir).validation.values())
    rows = [score(model, documents) for model in args.models]
    print(f"{describe_machine().get('cpu')}; held-out plays, windows of {CONTEXT} tokens")
    print("\n".join(table(["model", "tokens", "float32", "bfloat16", "bfloat16 / float32"],
                          [[r["model"], f"{r['tokens']:,}", f"{r['float32']:.3f}", f"{r['bfloat16']:.3f}",
                            f"{r['bfloat16'] / r['float32']:.4f}"] for r in rows])))
    if args.out:
        write_json(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
