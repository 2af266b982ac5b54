"""`quill train`: train the default recipes on Shakespeare and write checkpoints + RESULTS.json."""

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

from quill.models.training.pipeline import bigram_baseline, prepare_dataset, train_recipe
from quill.models.training.recipes import get_recipe, recipe_names

RESULTS_FILE = "RESULTS.json"


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Register `train` on an argparse subparsers object; the handler is `args.func(args) -> int`."""
    parser = subparsers.add_parser(
        "train",
        help="train the default models on Shakespeare",
        description="Train the default recipes on the public-domain Shakespeare corpus, "
                    "report held-out perplexity against a Kneser-Ney bigram baseline, "
                    "and save float16 checkpoints plus RESULTS.json.",
    )
    parser.add_argument(
        "recipes", nargs="*", default=["all"], metavar="RECIPE",
        help=f"recipes to train, or 'all' (default): {', '.join(recipe_names())}",
    )
    parser.add_argument("--out", type=Path, default=Path("quill/models/checkpoints"), help="checkpoint directory")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="corpus and tokenizer cache")
    parser.add_argument(
        "--minutes", type=float, default=None, help="wall-clock budget per recipe (default: the recipe's)"
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per recipe (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=None, help="seed for weights and batches (default: the recipe's)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: re-picked during the run from measured step times)",
    )
    parser.set_defaults(func=run_train)
    return parser


def selected_recipes(names: list[str]) -> list:
    if not names or names == ["all"]:
        names = recipe_names()
    return [get_recipe(name) for name in names]


def run_train(args: argparse.Namespace) -> int:
    try:
        recipes = selected_recipes(args.recipes)
    except KeyError as error:
        print(f"quill train: {error.args[0]}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    dataset = prepare_dataset(args.data_dir)
    corpus = dataset.describe()
    print(f"corpus: {corpus['train_tokens']:,} training tokens, {corpus['validation_tokens']:,} held-out tokens "
          f"({', '.join(corpus['validation_documents'])}), vocabulary {corpus['vocab_size']}")
    bigram = bigram_baseline(dataset)
    print(f"bigram baseline ({bigram['method']}): validation perplexity {bigram['validation_perplexity']:.2f}")

    results = read_results(args.out / RESULTS_FILE, corpus["tokenizer_sha256"])
    results.update(corpus=corpus, bigram=bigram, command=format_command(args))
    for recipe in recipes:
        overrides = {key: value for key, value in
                     {"max_minutes": args.minutes, "max_steps": args.steps, "seed": args.seed,
                      "num_threads": args.threads}.items()
                     if value is not None}
        if args.steps is not None:  # a shorter run keeps the recipe's warmup-to-length ratio at most
            overrides["warmup_steps"] = min(recipe.training.warmup_steps, args.steps // 10)
        config = dataclasses.replace(recipe.training, **overrides)
        figures = train_recipe(
            recipe, dataset, args.out, config, args.device,
            extra_metadata={"corpus": corpus, "bigram_validation_perplexity": bigram["validation_perplexity"]},
        )
        print(f"{recipe.name}: {figures['parameters']:,} parameters, validation perplexity "
              f"{figures['validation_perplexity']:.2f} (float16 as saved; "
              f"bigram {bigram['validation_perplexity']:.2f}), "
              f"{figures['training_seconds']:.0f}s, {figures['tokens_seen']:,} tokens")
        results["models"][recipe.name] = {**figures, "command": results["command"]}
        write_results(args.out / RESULTS_FILE, results)  # after each model, so a crash keeps what finished

    print_table(results)
    print(f"wrote {args.out / RESULTS_FILE} in {time.perf_counter() - started:.0f}s")
    return 0


def format_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (defaults left out)."""
    words = ["quill", "train", *args.recipes]
    for flag, value in [("--minutes", args.minutes), ("--steps", args.steps), ("--seed", args.seed),
                        ("--threads", args.threads)]:
        if value is not None:
            words += [flag, str(value)]
    if args.device != "cpu":
        words += ["--device", args.device]
    return shlex.join(words)


def read_results(path: Path, tokenizer_sha256: str) -> dict:
    """Earlier results to extend, only if they were measured with the same tokenizer (else incomparable)."""
    if path.exists():
        previous = json.loads(path.read_text())
        if previous.get("corpus", {}).get("tokenizer_sha256") == tokenizer_sha256:
            previous.setdefault("models", {})
            return previous
    return {"models": {}}


def write_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def print_table(results: dict) -> None:
    bigram = results["bigram"]["validation_perplexity"]
    print(f"\n{'model':<26}{'architecture':<13}{'parameters':>12}{'val ppl':>10}{'bigram':>9}{'minutes':>9}  machine")
    for name, figures in results["models"].items():
        machine = figures["machine"]
        print(f"{name:<26}{figures['architecture']:<13}{figures['parameters']:>12,}"
              f" {figures['validation_perplexity']:>9.2f} {bigram:>8.2f}{figures['training_seconds'] / 60:>9.1f}  "
              f"{machine['cpu']}, {machine['cores']} cores, {machine['device']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quill")
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
