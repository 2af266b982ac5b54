"""What one long Mamba prefill costs: Quill's `step` (with the scan the device gets, in chunks, and as a loop per
token) against transformers' full forward, on a random-weight model of mamba-130m's shape (or smaller).

    .venv/bin/python -m benchmarks.mamba_prefill                       # mamba-130m shape, 2,000 tokens
    .venv/bin/python -m benchmarks.mamba_prefill --tokens 500 --layers 4 --repeats 1
    .venv/bin/python -m benchmarks.mamba_prefill --device cuda --repeats 3

Prints the machine, each way's best time over --repeats, and the largest logit difference from transformers. At
mamba-130m's shape with random weights that difference is a few 1e-3 (logits up to ~15): the size of transformers'
own float32 error against float64 there, the random residual stream growing to ~1e3 over 24 layers.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import torch

from benchmarks.hardware import describe_device, describe_machine, load_average, synchronize
from models import mamba_scan
from models.batch import StepBatch
from models.checkpoint import load_checkpoint


def build(directory: str, layers: int, vocab: int, device: str):
    import transformers

    from tests.conftest import build_hf_tokenizer

    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=vocab, hidden_size=768, num_hidden_layers=layers, state_size=16,
                                      expand=2, conv_kernel=4)
    reference = transformers.MambaForCausalLM(config).float().eval()
    reference.save_pretrained(directory)
    build_hf_tokenizer(300).save(f"{directory}/tokenizer.json")
    return reference.to(device), load_checkpoint(directory, device=device, dtype="float32").model


def best_of(repeats: int, run, device: torch.device) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        out = run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=50280)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(describe_machine(), describe_device(device), "load average", load_average())
    with tempfile.TemporaryDirectory() as directory:
        reference, model = build(directory, args.layers, args.vocab, args.device)
    ids = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(1)).to(device)
    batch = StepBatch.build([ids[0].tolist()], [0], slots=[0], logits="all", device=device)

    def quill_step():
        return model.step(batch, model.new_state(1))

    with torch.inference_mode():
        hf_time, expected = best_of(args.repeats, lambda: reference(ids).logits[0], device)
    own = mamba_scan.chunk_length(args.tokens, device)
    chunk = math.ceil(math.sqrt(args.tokens) / 2)  # what a GPU runs (mamba_scan.chunk_length)
    other = (f"chunks of {chunk}", chunk) if own == args.tokens else ("loop per token", args.tokens)
    times, logits = {}, {}
    for name, length in ((f"device's ({'loop' if own == args.tokens else f'chunks of {own}'})", None), other):
        model.scan_chunk = length
        times[name], logits[name] = best_of(args.repeats, quill_step, device)
    model.scan_chunk = None
    print(f"{args.tokens}-token prefill, d_model 768, {args.layers} layers, vocabulary {args.vocab}, "
          f"best of {args.repeats}:")
    print(f"  transformers full forward            {hf_time:7.2f} s")
    for name, seconds in times.items():
        diff = (logits[name] - expected).abs().max()
        print(f"  Quill step, scan {name:19s} {seconds:7.2f} s  max |logit diff| from transformers {diff:.1e}")



if __name__ == "__main__":
    main()
