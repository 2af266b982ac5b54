"""xLSTM prefill on the CPU: one long prompt through Quill's `step` (the chunkwise-parallel form, from an empty
slot) against transformers' `xLSTMForCausalLM` forward (its chunkwise kernel, then its recurrence for the
remainder), on the same random weights; and a decode step of each after it.

    python -m benchmarks.xlstm_bench --out runs/xlstm.json     # ~1-2 min on 2 cores
    python -m benchmarks.xlstm_bench --chunk-size 128          # Quill's prefill pieces of 128 tokens
    python -m benchmarks.xlstm_bench --smoke                   # seconds: checks that it runs, measures nothing

The shape: 512 wide, 12 blocks, 4 heads (xLSTM-7b's proportions otherwise: qk_dim_factor 0.5, feed-forward 2.667),
vocabulary 50,304 (xLSTM-7b's). transformers computes logits for every position; Quill's step for the last only
(what the engine asks of a prefill) and, to compare like with like, for every position too.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from quill.models.batch import StepBatch
from quill.models.loading.hf import config_from_hf
from quill.models.families.xlstm import XLSTMLanguageModel

from .common.checkpoints import randomize_xlstm_gates
from .common.hardware import describe_machine, load_average
from .common.timing import interleaved_times, write_json

SHAPE = dict(vocab_size=50304, hidden_size=512, num_hidden_layers=12, num_heads=4)
SMOKE_SHAPE = dict(vocab_size=300, hidden_size=128, num_hidden_layers=2, num_heads=4)


def build(shape: dict, chunk_size: int):
    """transformers' model with random weights (gates included) and ours with the same weights."""
    import transformers

    torch.manual_seed(0)
    reference = transformers.xLSTMForCausalLM(transformers.xLSTMConfig(**shape, chunk_size=64)).eval()
    randomize_xlstm_gates(reference)
    config = config_from_hf({**reference.config.to_dict(), "chunk_size": chunk_size})[0]
    ours = XLSTMLanguageModel(config).eval().requires_grad_(False)
    ours.load_state_dict(reference.state_dict())
    return reference.requires_grad_(False), ours


def interleaved_seconds(contenders: dict, repeats: int) -> dict:
    """name -> {"median", "best"} wall seconds of each callable, timed in turn (see `interleaved_times`)."""
    times = interleaved_times(contenders, repeats)
    return {name: {"median": statistics.median(t["wall"]), "best": min(t["wall"])} for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000, help="prompt length")
    parser.add_argument("--chunk-size", type=int, default=64, help="Quill's chunkwise prefill piece")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny shape and prompt: checks that it runs")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape, length = (SMOKE_SHAPE, 40) if args.smoke else (SHAPE, args.tokens)
    reference, ours = build(shape, args.chunk_size)
    prompt = torch.randint(0, shape["vocab_size"], (length,), generator=torch.Generator().manual_seed(1))
    results = {"machine": describe_machine(), "load_average_start": load_average(), "shape": shape,
               "tokens": length, "chunk_size": args.chunk_size}

    def quill_prefill(logits: str):
        state = ours.new_state(1)
        batch = StepBatch.build([prompt.tolist()], [0], slots=[0], logits=logits)

        def run():
            state.reset([0])  # from the empty sequence every time
            return ours.step(batch, state)

        return run

    def transformers_prefill():
        with torch.no_grad():
            return reference(prompt[None], use_cache=True)

    prefill = interleaved_seconds({"quill_last": quill_prefill("last"), "quill_all": quill_prefill("all"),
                                   "transformers": transformers_prefill}, args.repeats)
    results["prefill_s"] = prefill
    results["prefill_speedup_like_for_like"] = prefill["transformers"]["median"] / prefill["quill_all"]["median"]

    # one decode step after the prompt, each from its own saved state
    state = ours.new_state(1)
    ours.step(StepBatch.build([prompt.tolist()], [0], slots=[0]), state)
    saved = {name: t.clone() for name, t in state.tensors.items()}
    decode = StepBatch.build([[7]], [length], slots=[0])

    def quill_decode():
        for name, t in saved.items():
            state[name].copy_(t)
        return ours.step(decode, state)

    cache = transformers_prefill().cache_params
    first = {i: tuple(t.clone() for t in layer) for i, layer in cache.rnn_state.items()}

    def transformers_decode():
        cache.rnn_state = {i: tuple(t.clone() for t in layer) for i, layer in first.items()}
        with torch.no_grad():
            return reference(torch.tensor([[7]]), cache_params=cache, use_cache=True).logits[0, -1]

    decode_s = interleaved_seconds({"quill": quill_decode, "transformers": transformers_decode}, 5 * args.repeats)
    results["decode_ms"] = {name: {k: 1e3 * v for k, v in t.items()} for name, t in decode_s.items()}
    results["decode_logits_max_difference"] = float((quill_decode()[0] - transformers_decode()).abs().max())
    results["state_bytes_per_sequence"] = state.bytes_per_slot
    results["load_average_end"] = load_average()
    print(json.dumps(results, indent=2))
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
