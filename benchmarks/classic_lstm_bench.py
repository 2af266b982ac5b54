"""A classic LSTM served by Quill's engine: 64 requests at once against one at a time, in process, on the CPU.

    python -m benchmarks.classic_lstm_bench                       # AWD-LSTM shape, ~5 min on 2 cores
    python -m benchmarks.classic_lstm_bench --repeats 1 --max-tokens 16 --out results.json

The model has the shape of fastai's WT103 AWD-LSTM (embedding 400, LSTM layers 1152, 1152, 400, tied
60,000-word softmax with a bias) and random weights, written as fastai saves it (lstm_fwd.pth +
itos_wt103.pkl) and loaded the way `quill serve` loads the original files (converted through
quill/models/classic). Every request has its own random prompt and generates exactly --max-tokens tokens,
greedy, so both runs do the same work. The runs alternate (batched, serial, batched, ...) so a noisy
shared machine hurts both alike; the figures are the medians.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch

from quill.models.loading.checkpoint import load_checkpoint

from .common import quill_runs
from .common.hardware import describe_machine, load_average
from .common.timing import write_json
from .common.tokenized import TokenizedRequest

AWD_VOCAB, AWD_EMBED, AWD_HIDDEN = 60_000, 400, 1152  # fastai's WT103 model: layers of 1152, 1152, 400
MARKERS = ["xxunk", "xxpad", "xxbos", "xxeos", "xxfld", "xxmaj", "xxup", "xxrep", "xxwrep"]


def write_awd_lstm(directory: Path, vocab_size: int, d_embed: int, layer_sizes: list[int], seed: int = 0) -> Path:
    """Random weights under fastai's names, as learner.save and the model zoo lay them out."""
    g = torch.Generator().manual_seed(seed)
    sd = OrderedDict({"0.encoder.weight": torch.randn(vocab_size, d_embed, generator=g) * 0.1})
    sizes = [d_embed] + layer_sizes
    for k, (d_in, d_hidden) in enumerate(zip(sizes, sizes[1:])):
        scale = d_hidden ** -0.5
        sd[f"0.rnns.{k}.weight_hh_l0_raw"] = torch.randn(4 * d_hidden, d_hidden, generator=g) * scale
        sd[f"0.rnns.{k}.module.weight_ih_l0"] = torch.randn(4 * d_hidden, d_in, generator=g) * scale
        sd[f"0.rnns.{k}.module.bias_ih_l0"] = torch.zeros(4 * d_hidden)
        sd[f"0.rnns.{k}.module.bias_hh_l0"] = torch.zeros(4 * d_hidden)
    sd["1.decoder.weight"] = sd["0.encoder.weight"]
    sd["1.decoder.bias"] = torch.zeros(vocab_size)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"model": sd}, directory / "lstm_fwd.pth")
    with open(directory / "itos_wt103.pkl", "wb") as f:
        pickle.dump(MARKERS + [f"w{i}" for i in range(vocab_size - len(MARKERS))], f)
    return directory


def workload(num_requests: int, prompt_len: int, max_tokens: int, vocab_size: int, tag: str,
             seed: int) -> list[TokenizedRequest]:
    g = torch.Generator().manual_seed(seed)
    return [TokenizedRequest(f"{tag}{i}", torch.randint(len(MARKERS), vocab_size, (prompt_len,), generator=g).tolist(),
                             max_tokens, {"temperature": 0.0}) for i in range(num_requests)]


def run(args: argparse.Namespace, log=print) -> dict:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    shape = dict(vocab_size=args.vocab_size, d_embed=args.embed, layer_sizes=[args.hidden, args.hidden, args.embed])
    before = os.environ.get("QUILL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["QUILL_CACHE_DIR"] = str(Path(tmp) / "cache")  # a conversion of its own, never the user's
        try:
            source = write_awd_lstm(Path(tmp) / "wt103", **shape)
            loaded = load_checkpoint(source, device="cpu", dtype="float32", name="awd-lstm-random")
        finally:
            if before is None:
                del os.environ["QUILL_CACHE_DIR"]
            else:
                os.environ["QUILL_CACHE_DIR"] = before
    vocab = args.vocab_size
    requests = workload(args.requests, args.prompt_len, args.max_tokens, vocab, "r", seed=1)
    warmup = workload(4, args.prompt_len, 2, vocab, "w", seed=2)
    engine = quill_runs.make_engine(loaded, requests + warmup, block_size=16, max_num_seqs=args.requests)
    batched, serial = [], []
    for repeat in range(args.repeats):
        log(f"repeat {repeat + 1}/{args.repeats}: {args.requests} at once ...")
        batched.append(quill_runs.engine_throughput(engine, requests, warmup).tokens_per_s)
        log(f"repeat {repeat + 1}/{args.repeats}: {args.serial_requests} one at a time ...")
        serial.append(quill_runs.engine_serial(engine, requests[: args.serial_requests], warmup).tokens_per_s)
        log(f"  {batched[-1]:.0f} tokens/s at once, {serial[-1]:.1f} tokens/s one at a time")
    if engine.cache.usage != 0:
        raise RuntimeError(f"cache usage {engine.cache.usage} after every request finished")
    return {
        "model": {"shape": shape, "parameters": loaded.num_parameters,
                  "bytes_per_slot": engine.state.bytes_per_slot},
        "workload": {"requests": args.requests, "serial_requests": args.serial_requests,
                     "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "greedy": True},
        "tokens_per_s_at_once": batched, "tokens_per_s_one_at_a_time": serial,
        "median_at_once": statistics.median(batched), "median_one_at_a_time": statistics.median(serial),
        "ratio_of_medians": statistics.median(batched) / statistics.median(serial),
        "machine": describe_machine() | {"threads": torch.get_num_threads(), "load_average_end": load_average()},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.classic_lstm_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--vocab-size", type=int, default=AWD_VOCAB)
    parser.add_argument("--embed", type=int, default=AWD_EMBED, help="embedding and top layer width")
    parser.add_argument("--hidden", type=int, default=AWD_HIDDEN, help="width of the two lower layers")
    parser.add_argument("--requests", type=int, default=64, help="served at once (default 64)")
    parser.add_argument("--serial-requests", type=int, default=8,
                        help="of the same requests, served one at a time (its rate is per token: fewer suffice)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = run(args)
    print(f"AWD-LSTM shape, random weights, {results['model']['parameters'] / 1e6:.1f} M parameters, "
          f"{results['machine'].get('cpu', '?')}: {results['median_at_once']:.0f} tokens/s with {args.requests} at "
          f"once, {results['median_one_at_a_time']:.1f} tokens/s one at a time "
          f"(medians of {args.repeats}): {results['ratio_of_medians']:.1f}x")
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
