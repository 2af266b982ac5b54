"""What prefilling a long prompt costs a Mamba-1 model: Quill's step (the selective scan as a loop over the tokens,
as a CPU runs it, and in chunks, as a GPU does: models/mamba_scan.py) against transformers' full forward (its
PyTorch fallback, mamba_ssm absent), on the same random weights of mamba-130m's shape.

    .venv/bin/python -m benchmarks.mamba_prefill                        # mamba-130m shape, 2,000 tokens
    .venv/bin/python -m benchmarks.mamba_prefill --threads 1 --chunks 16 64 --out runs/mamba_prefill.json
    .venv/bin/python -m benchmarks.mamba_prefill --smoke                # seconds, a tiny shape

Each figure is the fastest of --repeats runs, interleaved (a busy machine slows them alike), after a warm-up;
one sequence; only the last token's logits, as a prefill needs. Beside wall time, the process's CPU time, which
other work on a shared machine moves less. Random weights: no download.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.hardware import describe_device, describe_machine, load_average, synchronize
from models.batch import StepBatch
from models.hf_families import FAMILIES
from models.mamba import MambaLanguageModel

# state-spaces/mamba-130m-hf's shape (tied embeddings).
SHAPE_130M = dict(vocab_size=50280, hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4,
                  time_step_rank=48)
SHAPE_TINY = dict(SHAPE_130M, vocab_size=300, hidden_size=32, num_hidden_layers=2, state_size=8, time_step_rank=4)


def build(shape: dict, device: torch.device):
    """transformers' MambaForCausalLM with random weights, and ours holding the same tensors."""
    import transformers

    torch.manual_seed(0)
    reference = transformers.MambaForCausalLM(transformers.MambaConfig(**shape)).eval().to(device)
    family = FAMILIES["mamba"]
    ours = MambaLanguageModel(family.read_config({**family.defaults, **reference.config.to_dict()}))
    missing, unexpected = ours.load_state_dict(reference.state_dict(), strict=False)
    if missing or set(unexpected) - {"lm_head.weight"}:  # tied: transformers lists lm_head, we do not
        raise RuntimeError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    return reference, ours.eval().to(device)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--chunks", type=int, nargs="+", default=[23], help="scan chunk lengths to time beside "
                        "the token loop (23: what a GPU runs for 2,000 tokens)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape and prompt: shows the code runs")
    parser.add_argument("--out", type=Path, help="also write the results here, as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.repeats = 40, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shape = SHAPE_TINY if args.smoke else SHAPE_130M
    reference, ours = build(shape, device)
    ids = torch.randint(0, shape["vocab_size"], (args.tokens,), generator=torch.Generator().manual_seed(1))
    results = {"machine": describe_machine(), "device": describe_device(device), "load_average": load_average(),
               "shape": shape, "tokens": args.tokens, "runs": {}}
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}))

    def prefill(chunk: int) -> torch.Tensor:
        ours.scan_chunk = chunk
        return ours.step(StepBatch.build([ids.tolist()], [0], slots=[0], device=device), ours.new_state(1))

    runs = {"transformers": lambda: reference(ids[None].to(device), logits_to_keep=1, use_cache=False).logits[0],
            "quill, token loop": lambda: prefill(args.tokens)}
    runs |= {f"quill, chunks of {chunk}": (lambda chunk=chunk: prefill(chunk)) for chunk in args.chunks}
    wall, cpu = dict.fromkeys(runs, float("inf")), dict.fromkeys(runs, float("inf"))
    with torch.inference_mode():
        want = runs["transformers"]()[-1]
        errors = {name: ((fn()[-1] - want).abs().max() / want.abs().max()).item() for name, fn in runs.items()}
        for _ in range(args.repeats):
            for name, fn in runs.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                synchronize(device)
                wall[name] = min(wall[name], time.perf_counter() - start)
                cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    ours.scan_chunk = None
    for name in runs:
        run = results["runs"][name] = {"wall_s": wall[name], "cpu_s": cpu[name],
                                       "tokens_per_s": args.tokens / wall[name], "logit_error": errors[name]}
        line = f"{name}: {wall[name]:.2f} s wall ({run['tokens_per_s']:,.0f} tokens/s), {cpu[name]:.2f} CPU s"
        if name != "transformers":
            run["speedup_wall"], run["speedup_cpu"] = wall["transformers"] / wall[name], cpu["transformers"] / cpu[name]
            line += (f"; {run['speedup_wall']:.2f}x transformers' speed by wall time, {run['speedup_cpu']:.2f}x by "
                     f"CPU time; last logits within {errors[name]:.1e} of its, relative")
        print(line)
    results["load_average_after"] = load_average()
    print(json.dumps({"load_average_after": results["load_average_after"]}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
