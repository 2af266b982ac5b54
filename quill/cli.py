"""The `quill` command: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quill.models.loading.checkpoint import DTYPES, CheckpointError, load_checkpoint

from quill.clients.bench.cli import add_bench_parser
from quill.clients.cli import add_client_parsers, run_guarded
from quill.server.config import add_serve_arguments, config_from_args
from quill.server.engine import generate, run_worker
from quill.server.sampling import SamplingParams


def _generate(args: argparse.Namespace) -> int:
    loaded = load_checkpoint(args.model, device=args.device, dtype=args.dtype, revision=args.revision)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k or -1,
                            seed=args.seed, ignore_eos=args.ignore_eos)
    sys.stdout.write(args.prompt)
    for delta in generate(loaded, args.prompt, params):
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _add_generate_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="load a checkpoint and continue a prompt, offline")
    p.add_argument("prompt")
    p.add_argument("--model", default="shakespeare-transformer",
                   help="checkpoint directory, bundled model name, Hugging Face hub id (org/name), or a classic "
                        "toolkit's model file (or its directory, the vocabulary beside it)")
    p.add_argument("--revision", default=None,
                   help="of a hub id: a branch or tag (the cache's refs/REV) or a commit, in full or a prefix of a "
                        "cached one (default: main)")
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, default=40, help="0 to sample from the whole vocabulary")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.set_defaults(run=_generate)


def _convert(args: argparse.Namespace) -> int:
    from quill.models.classic.conversion import convert  # the classic formats load only for this command

    converted = convert(args.source, args.vocab, args.format)
    out = converted.save(Path(args.out), DTYPES[args.dtype])
    print(f"{args.source} ({converted.metadata['source_format']}) -> {out}")
    return 0


def _add_convert_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="write a classic toolkit's checkpoint as a Quill checkpoint directory")
    p.add_argument("source", help="the model file, or the directory holding it and its vocabulary")
    p.add_argument("--vocab", default=None,
                   help="vocabulary file or training-data directory, where the model does not keep its own "
                        "(default: looked for beside the model)")
    p.add_argument("--format", default=None, help="the toolkit's format, when it cannot be told from the files")
    p.add_argument("--out", required=True, help="directory to write (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="of the weights written")
    p.set_defaults(run=_convert)


def _serve(args: argparse.Namespace) -> int:
    from quill.server.serve import serve  # the HTTP stack loads only for this command

    return serve(config_from_args(args))


def _add_serve_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve models over HTTP (OpenAI and TGI dialects)")
    add_serve_arguments(p)
    p.set_defaults(run=_serve)


def _add_tp_worker_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tp-worker", help="a tensor-parallel rank past 0, started apart (e.g. on another machine): it loads its shard "
                          "of the model that rank 0 (`quill serve --tensor-parallel-workers external`) serves and "
                          "follows its steps; configured by torch.distributed's environment: MASTER_ADDR, "
                          "MASTER_PORT (rank 0's), RANK, WORLD_SIZE, LOCAL_RANK (its CUDA device, default 0)")
    p.set_defaults(run=lambda args: run_worker())


def _add_train_parser(subparsers) -> None:
    from quill.models.training.cli import add_train_parser

    add_train_parser(subparsers).set_defaults(run=lambda args: args.func(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quill", description="Quill: serve LSTM, gated-CNN, Transformer and state-space language models")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_serve_parser(subparsers)
    _add_generate_parser(subparsers)
    _add_convert_parser(subparsers)
    _add_tp_worker_parser(subparsers)
    _add_train_parser(subparsers)
    add_client_parsers(subparsers)
    add_bench_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_guarded(args.run, args)
    except (CheckpointError, ValueError) as e:
        print(f"quill {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
