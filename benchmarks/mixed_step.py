"""A continuous-batching step that mixes one prefill chunk with many decodes, for each architecture with a slot
state that splits its steps (LFM2's conv layers beside its attention included): the step as Quill runs it (decode
rows apart from the chunk, `models.batch.split_decodes`) against the same step run as one part padded to the
chunk's length (how fconv, Mamba-2 and LFM2 ran it before), interleaved in one run. Both give the same logits; the
ratio is what padding the decode rows cost. (The gated CNN, measured here before, now packs every step without
padding: StepBatch.window_index.)

    python -m benchmarks.mixed_step [--chunk 256] [--decodes 31] [--repeats 5] [--threads 2] [--models ...]
                                    [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from unittest import mock

import torch

from quill.models.batch import StepBatch
from quill.models.families import fconv, lfm2, mamba, xlstm
from quill.models.families.registry import ARCHITECTURES
from quill.models.state import new_model_state

from .common.hardware import describe_machine, load_average
from .common.timing import interleaved_times, write_json

VOCAB = 8000
BLOCK_SIZE = 16  # LFM2's attention layers' K,V blocks
# name -> (architecture, its config, the module whose step splits its parts: patched for the padded contender).
# Small shapes of each family by default, so that all of them run in about a minute on 2 CPU cores.
SHAPES = {
    "fconv": ("fconv", dict(embed_dim=256, layers=[[256, 4, 1]] * 6, out_embed_dim=256), fconv),
    "mamba": ("mamba", dict(d_model=256, n_layers=4, d_inner=512, dt_rank=16), mamba),
    "mamba2": ("mamba2", dict(hidden_size=256, num_layers=4, num_heads=8, head_dim=64, state_size=64),
               mamba),
    "xlstm": ("xlstm", dict(d_model=256, n_blocks=4, n_heads=4, chunk_size=64), xlstm),
    "lfm2": ("lfm2", dict(d_model=256, layer_types=["conv", "conv", "full_attention", "conv"], d_ff=768),
             lfm2),
}
DEFAULT_MODELS = list(SHAPES)
# On request only (--models): LFM2-350M's width and feed-forward, 4 conv and 2 attention layers.
SHAPES["lfm2_1024"] = ("lfm2", dict(d_model=1024, layer_types=["conv", "conv", "full_attention"] * 2, n_heads=16,
                                    n_kv_heads=8, d_ff=4608), lfm2)


def padded_step(model, module, batch: StepBatch, state) -> torch.Tensor:
    """The step run as one part, every row padded to the longest chunk (the behaviour before the split)."""
    with mock.patch.object(module, "split_decodes", side_effect=lambda batch: [(batch, None)]) as one_part:
        logits = model.step(batch, state)
    if not one_part.called:  # else both contenders ran the same split step
        raise RuntimeError(f"{type(model).__name__} does not split its step by {module.__name__}.split_decodes")
    return logits


def mixed_batch(chunk: int, decodes: int) -> StepBatch:
    """Sequence 0 prefills `chunk` tokens after 100 computed ones; sequences 1.. decode one token each. Each has a
    slot and blocks of its own (a model without K,V reads only the slots)."""
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, VOCAB, (chunk,), generator=generator).tolist()]
    tokens += [[int(t)] for t in torch.randint(0, VOCAB, (decodes,), generator=generator)]
    tables, used = [], 0
    for new in tokens:
        count = -(-(100 + len(new)) // BLOCK_SIZE)
        tables.append(list(range(used, used + count)))
        used += count
    return StepBatch.build(tokens, [100] * len(tokens), slots=list(range(len(tokens))), block_tables=tables)


def new_state(model, batch: StepBatch):
    """Room for the batch's slots and blocks, of whichever kinds the model holds."""
    return new_model_state(model, int(batch.block_tables.max()) + 1, batch.num_seqs, BLOCK_SIZE)


def run(args: argparse.Namespace) -> dict:
    results = {"machine": describe_machine(), "load_average": load_average(), "chunk": args.chunk,
               "decodes": args.decodes, "repeats": args.repeats, "threads": torch.get_num_threads(), "models": {}}
    batch = mixed_batch(args.chunk, args.decodes)
    for name in args.models:
        architecture, shape, module = SHAPES[name]
        config_cls, model_cls = ARCHITECTURES[architecture]
        torch.manual_seed(0)
        model = model_cls(config_cls(vocab_size=VOCAB, **shape)).eval()
        want = model.step(batch, new_state(model, batch))
        difference = (padded_step(model, module, batch, new_state(model, batch)) - want).abs().max().item()
        state = new_state(model, batch)  # stepped again and again: its values do not change the work
        times = interleaved_times({"split": lambda: model.step(batch, state),
                                   "padded": lambda: padded_step(model, module, batch, state)}, args.repeats)
        split_s, padded_s = (statistics.median(times[k]["wall"]) for k in ("split", "padded"))
        results["models"][name] = {"split_ms": split_s * 1e3, "padded_ms": padded_s * 1e3,
                                   "padded_over_split": padded_s / split_s, "max_logit_difference": difference}
        print(f"{name}: split {split_s * 1e3:.1f} ms, padded {padded_s * 1e3:.1f} ms "
              f"({padded_s / split_s:.1f}x), logits within {difference:.1e}", flush=True)
    results["load_average_after"] = load_average()
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=256, help="the prefill chunk's tokens")
    parser.add_argument("--decodes", type=int, default=31, help="sequences decoding one token each")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", nargs="+", choices=list(SHAPES), default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, help="also write the results here, as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = run(args)
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
