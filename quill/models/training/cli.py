"""`quill train`: train the default recipes on Shakespeare and write checkpoints + RESULTS.json.

Each recipe's task (recipes.py) says how: the BPE language models against the bigram baseline, the byte-level one
in bits per character, the restoration models scored through the engine against copying the source.
"""

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

from quill.models.training.byte_lm import bits_per_character, held_out_characters, prepare_byte_dataset
from quill.models.training.evaluate_restoration import copy_baseline, evaluate_checkpoint
from quill.models.training.pipeline import bigram_baseline, prepare_dataset, train_recipe
from quill.models.training.recipes import RESTORATION_RECIPES, get_recipe, recipe_names
from quill.models.training.restoration_pipeline import prepare_restoration, train_restoration_recipe

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
    parser.add_argument("--beam", type=int, default=4,
                        help="restoration models: the beam width scored beside greedy decoding (0: greedy only)")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="re-score the saved restoration checkpoints, training nothing ('all': every one)")
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
    if args.evaluate_only:
        recipes = RESTORATION_RECIPES if args.recipes in ([], ["all"]) else recipes
        if any(recipe.task != "restoration" for recipe in recipes):
            print("quill train: --evaluate-only re-scores restoration recipes only", file=sys.stderr)
            return 2

    started = time.perf_counter()
    path = args.out / RESULTS_FILE
    for task in dict.fromkeys(recipe.task for recipe in recipes):
        TASK_RUNS[task]([recipe for recipe in recipes if recipe.task == task], args, path)
    print_table(read_results_file(path))
    print(f"wrote {path} in {time.perf_counter() - started:.0f}s")
    return 0


def recipe_config(recipe, args: argparse.Namespace):
    overrides = {key: value for key, value in
                 {"max_minutes": args.minutes, "max_steps": args.steps, "seed": args.seed,
                  "num_threads": args.threads}.items()
                 if value is not None}
    if args.steps is not None:  # a shorter run keeps the recipe's warmup-to-length ratio at most
        overrides["warmup_steps"] = min(recipe.training.warmup_steps, args.steps // 10)
    return dataclasses.replace(recipe.training, **overrides)


def train_language_models(recipes: list, args: argparse.Namespace, path: Path) -> None:
    dataset = prepare_dataset(args.data_dir)
    corpus = dataset.describe()
    print(f"corpus: {corpus['train_tokens']:,} training tokens, {corpus['validation_tokens']:,} held-out tokens "
          f"({', '.join(corpus['validation_documents'])}), vocabulary {corpus['vocab_size']}")
    bigram = bigram_baseline(dataset)
    print(f"bigram baseline ({bigram['method']}): validation perplexity {bigram['validation_perplexity']:.2f}")

    results = read_results(path, corpus["tokenizer_sha256"])
    results.update(corpus=corpus, bigram=bigram, command=format_command(args))
    for recipe in recipes:
        figures = train_recipe(
            recipe, dataset, args.out, recipe_config(recipe, args), args.device,
            extra_metadata={"corpus": corpus, "bigram_validation_perplexity": bigram["validation_perplexity"]},
        )
        print(f"{recipe.name}: {figures['parameters']:,} parameters, validation perplexity "
              f"{figures['validation_perplexity']:.2f} (float16 as saved; "
              f"bigram {bigram['validation_perplexity']:.2f}), "
              f"{figures['training_seconds']:.0f}s, {figures['tokens_seen']:,} tokens")
        results["models"][recipe.name] = {**figures, "command": results["command"]}
        write_results(path, results)  # after each model, so a crash keeps what finished


def train_byte_language_models(recipes: list, args: argparse.Namespace, path: Path) -> None:
    dataset = prepare_byte_dataset(args.data_dir)
    corpus = dataset.describe()
    characters = held_out_characters(args.data_dir)
    counting = {"validation_characters": characters,
                "validation_predicted_tokens": int(dataset.validation_ids.size - 1)}
    for recipe in recipes:
        figures = train_recipe(recipe, dataset, args.out, recipe_config(recipe, args), args.device,
                               extra_metadata={"task": recipe.task, "corpus": corpus, **counting})
        bits = bits_per_character(figures["validation_perplexity"], dataset.validation_ids, characters)
        print(f"{recipe.name}: {figures['parameters']:,} parameters, {bits:.3f} bits per character held out "
              f"(float16 as saved), {figures['training_seconds']:.0f}s, {figures['tokens_seen']:,} bytes")
        results = read_results_file(path)
        results["models"][recipe.name] = {"task": recipe.task, **figures, "validation_bits_per_character": bits,
                                          **counting, "corpus": corpus, "command": format_command(args)}
        write_results(path, results)


def train_restoration_models(recipes: list, args: argparse.Namespace, path: Path) -> None:
    data = prepare_restoration(args.data_dir)
    task = data.describe()
    print(f"restoration: {task['train_pairs']:,} training pairs, {task['validation_pairs']:,} held-out pairs, "
          f"{task['sentencepiece_pieces']} SentencePiece pieces")
    pairs = data.evaluation_pairs()
    results = read_results_file(path)
    results["restoration"] = {**task, "evaluation_lines": len(pairs), "copy_baseline": copy_baseline(pairs)}
    baseline = results["restoration"]["copy_baseline"]
    print(f"copying the source: BLEU {baseline['bleu']:.1f}, exact match {baseline['exact_match']:.1%}")
    write_results(path, results)
    for recipe in recipes:
        if args.evaluate_only:
            scores = evaluate_checkpoint(args.out / recipe.name, pairs, args.beam or None)
            figures = {**results["models"].get(recipe.name, {}), "scores": scores}
        else:
            figures = train_restoration_recipe(recipe, data, args.out, recipe_config(recipe, args), args.device,
                                               args.beam or None)
            figures = {"task": recipe.task, **figures, "command": format_command(args)}
        figures["scores"]["command"] = format_command(args)  # what scored them (the training, or a re-scoring)
        print(f"{recipe.name}: " + ", ".join(f"{how} BLEU {s['bleu']:.1f}, exact match {s['exact_match']:.1%}"
                                             for how, s in figures["scores"].items() if isinstance(s, dict)
                                             and "bleu" in s))
        results = read_results_file(path)
        results["models"][recipe.name] = figures
        write_results(path, results)


TASK_RUNS = {
    "language-model": train_language_models,
    "byte-language-model": train_byte_language_models,
    "restoration": train_restoration_models,
}


def format_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (defaults left out)."""
    words = ["quill", "train", *args.recipes]
    for flag, value in [("--minutes", args.minutes), ("--steps", args.steps), ("--seed", args.seed),
                        ("--threads", args.threads)]:
        if value is not None:
            words += [flag, str(value)]
    if args.device != "cpu":
        words += ["--device", args.device]
    if args.beam != 4:
        words += ["--beam", str(args.beam)]
    if args.evaluate_only:
        words.append("--evaluate-only")
    return shlex.join(words)


def read_results(path: Path, tokenizer_sha256: str) -> dict:
    """Earlier results to extend; the BPE language models' only if they were measured with the same tokenizer
    (else incomparable: dropped, with the corpus and bigram they were measured against)."""
    previous = read_results_file(path)
    if previous.get("corpus", {}).get("tokenizer_sha256") != tokenizer_sha256:
        for key in ("corpus", "bigram", "command"):
            previous.pop(key, None)
        previous["models"] = {name: figures for name, figures in previous["models"].items()
                              if figures.get("task", "language-model") != "language-model"}
    return previous


def read_results_file(path: Path) -> dict:
    """RESULTS.json as it is (an empty one if there is none)."""
    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("models", {})
    return results


def write_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def print_table(results: dict) -> None:
    models = results["models"].items()
    language_models = [(name, f) for name, f in models if f.get("task", "language-model") == "language-model"]
    if language_models:
        bigram = results["bigram"]["validation_perplexity"]
        print(f"\n{'model':<26}{'architecture':<13}{'parameters':>12}{'val ppl':>10}{'bigram':>9}{'minutes':>9}  "
              f"machine")
        for name, figures in language_models:
            machine = figures["machine"]
            print(f"{name:<26}{figures['architecture']:<13}{figures['parameters']:>12,}"
                  f" {figures['validation_perplexity']:>9.2f} {bigram:>8.2f}{figures['training_seconds'] / 60:>9.1f}  "
                  f"{machine['cpu']}, {machine['cores']} cores, {machine['device']}")
    for name, figures in models:
        if figures.get("task") == "byte-language-model":
            print(f"\n{name}: {figures['validation_bits_per_character']:.3f} bits per character held out")
    restoration = [(name, f["scores"]) for name, f in models if f.get("task") == "restoration" and "scores" in f]
    if restoration:
        baseline = results["restoration"]["copy_baseline"]
        print(f"\n{'restoration (held-out lines)':<34}{'BLEU':>7}{'exact':>8}{'beam BLEU':>11}{'beam exact':>12}")
        print(f"{'copy the source':<34}{baseline['bleu']:>7.1f}{baseline['exact_match']:>8.1%}")
        for name, scores in restoration:
            beams = [s for key, s in scores.items() if key.startswith("beam")]
            beam = f"{beams[0]['bleu']:>11.1f}{beams[0]['exact_match']:>12.1%}" if beams else ""
            print(f"{name:<34}{scores['greedy']['bleu']:>7.1f}{scores['greedy']['exact_match']:>8.1%}{beam}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quill")
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
