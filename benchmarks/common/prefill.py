"""What the Mamba-1 and Mamba-2 prefill benchmarks share: their options, loading transformers' random weights into
Quill's model, and timing Quill's step at several scan chunks against transformers' full forward on one prompt."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from quill.models.batch import StepBatch

from .hardware import describe_device, describe_machine, load_average
from .timing import interleaved_times, write_json


def parse_options(argv: list[str] | None, description: str, chunks: list[int], chunks_help: str,
                  repeats: int) -> argparse.Namespace:
    """The options both take (`chunks` and `repeats`: each one's defaults); --smoke and --threads applied."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--chunks", type=int, nargs="+", default=chunks, help=chunks_help)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape and prompt: shows the code runs")
    parser.add_argument("--out", type=Path, help="also write the results here, as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.repeats = 40, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def load_tied(ours: torch.nn.Module, reference: torch.nn.Module) -> torch.nn.Module:
    """`ours` holding `reference`'s tensors; refuses any that do not match by name."""
    missing, unexpected = ours.load_state_dict(reference.state_dict(), strict=False)
    if missing or set(unexpected) - {"lm_head.weight"}:  # tied: transformers lists lm_head, we do not
        raise RuntimeError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    return ours


def compare(args: argparse.Namespace, shape: dict, reference, ours, chunks: dict[str, int]) -> dict:
    """transformers' forward against Quill's step at each scan chunk (run name -> the model's scan_chunk) on one
    random prompt of args.tokens: wall and CPU time (the fastest of args.repeats, interleaved),
    speed-ups and last-logit errors, printed, returned and written to args.out if given."""
    device = torch.device(args.device)
    ids = torch.randint(0, shape["vocab_size"], (args.tokens,), generator=torch.Generator().manual_seed(1))
    results = {"machine": describe_machine(), "device": describe_device(device), "load_average": load_average(),
               "shape": shape, "tokens": args.tokens, "runs": {}}
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}))

    def prefill(chunk: int) -> torch.Tensor:
        ours.scan_chunk = chunk
        return ours.step(StepBatch.build([ids.tolist()], [0], slots=[0], device=device), ours.new_state(1))

    runs = {"transformers": lambda: reference(ids[None].to(device), logits_to_keep=1, use_cache=False).logits[0]}
    runs |= {name: (lambda chunk=chunk: prefill(chunk)) for name, chunk in chunks.items()}
    with torch.inference_mode():
        want = runs["transformers"]()[-1]
        errors = {name: ((fn()[-1] - want).abs().max() / want.abs().max()).item() for name, fn in runs.items()
                  if name != "transformers"}
        times = interleaved_times(runs, args.repeats, device, warmup=False)  # the calls above warmed them up
    wall = {name: min(t["wall"]) for name, t in times.items()}
    cpu = {name: min(t["cpu"]) for name, t in times.items()}
    for name in runs:
        run = results["runs"][name] = {"wall_s": wall[name], "cpu_s": cpu[name],
                                       "tokens_per_s": args.tokens / wall[name]}
        line = f"{name}: {wall[name]:.2f} s wall ({run['tokens_per_s']:,.0f} tokens/s), {cpu[name]:.2f} CPU s"
        if name != "transformers":
            run["logit_error"] = errors[name]
            run["speedup_wall"], run["speedup_cpu"] = wall["transformers"] / wall[name], cpu["transformers"] / cpu[name]
            line += (f"; {run['speedup_wall']:.2f}x transformers' speed by wall time, {run['speedup_cpu']:.2f}x by "
                     f"CPU time; last logits within {errors[name]:.1e} of its, relative")
        print(line)
    results["load_average_after"] = load_average()
    print(json.dumps({"load_average_after": results["load_average_after"]}))
    write_json(args.out, results)
    return results
