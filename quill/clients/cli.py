"""Client subcommands of `quill`: `complete` (one prompt) and `compare` (decoding strategies side by side)."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import textwrap

from .client import DEFAULT_URL, Client
from .errors import QuillError

# name -> (options, how to read it): the choices the survey keeps comparing.
STRATEGIES = {
    "greedy": (dict(temperature=0), "argmax at every step"),
    "beam": (dict(beam_width=4), "beam search, width 4"),
    "top-k": (dict(temperature=1.0, top_k=40), "sample from the 40 most likely"),
    "top-p": (dict(temperature=1.0, top_p=0.9), "sample from the top 90% of mass"),
    "temperature": (dict(temperature=0.7), "sample from softmax(logits / 0.7)"),
    "pure": (dict(temperature=1.0), "sample from the model's distribution"),
}


def _add_client_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("QUILL_URL", DEFAULT_URL), help="server URL (env QUILL_URL)")
    p.add_argument("--api-key", default=None, help="bearer token (env QUILL_API_KEY)")


def _complete(args: argparse.Namespace) -> int:
    options = dict(model=args.model, max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, beam_width=args.beam_width, seed=args.seed)
    with Client(args.url, api_key=args.api_key) as client:
        if args.stream:
            for delta in client.stream(args.prompt, **options):
                sys.stdout.write(delta)
                sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            print(client.complete(args.prompt, **options).text)
    return 0


def distinct_bigrams(text: str) -> float:
    """Share of word bigrams that are distinct: 1.0 never repeats itself, low values loop."""
    words = text.split()
    pairs = list(zip(words, words[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


def _compare(args: argparse.Namespace) -> int:
    width = max(40, shutil.get_terminal_size((120, 20)).columns - 44)
    with Client(args.url, api_key=args.api_key) as client:
        models = args.model or [m.id for m in client.models()]
        for model in models:
            print(f"\n== {model}: {args.prompt!r}, {args.max_tokens} tokens, seed {args.seed}")
            print(f"{'strategy':<12} {'perplexity':>10} {'distinct-2':>10}  text")
            for name, (options, _) in STRATEGIES.items():
                result = client.complete(args.prompt, model=model, max_tokens=args.max_tokens, seed=args.seed,
                                         logprobs=0, **options)
                choice = result.choices[0]
                lps = [lp for lp in (choice.logprobs.token_logprobs if choice.logprobs else []) if lp is not None]
                ppl = math.exp(-sum(lps) / len(lps)) if lps else float("nan")
                lines = textwrap.wrap(" ".join(choice.text.split()), width) or [""]
                print(f"{name:<12} {ppl:>10.1f} {distinct_bigrams(choice.text):>10.2f}  {lines[0]}")
                for line in lines[1:]:
                    print(f"{'':<35}{line}")
    print("\nperplexity: of the generated text under the model itself (low = what the model finds likely);"
          "\ndistinct-2: share of distinct word bigrams (low = the text repeats itself).")
    return 0


def add_client_parsers(subparsers) -> None:
    p = subparsers.add_parser("complete", help="complete a prompt on a running server")
    p.add_argument("prompt")
    p.add_argument("--model", default=None, help="hosted model (default: the server's default)")
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--beam-width", type=int, default=None, help="beam search with this many beams")
    p.add_argument("--seed", type=int, default=None)
    _add_client_arguments(p)
    p.set_defaults(run=_complete)

    p = subparsers.add_parser("compare", help="one prompt through greedy, beam, top-k, top-p and temperature")
    p.add_argument("prompt")
    p.add_argument("--model", action="append", help="models to compare (default: every hosted model)")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    _add_client_arguments(p)
    p.set_defaults(run=_compare)


def run_guarded(run, args) -> int:
    """Server errors print the server's message and exit non-zero."""
    try:
        return run(args)
    except QuillError as e:
        print(f"quill {args.command}: error: {e.message}" + (f" (status {e.status})" if e.status else ""),
              file=sys.stderr)
        return 1
