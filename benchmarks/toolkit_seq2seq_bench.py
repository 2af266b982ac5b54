"""The toolkit translation models served by Quill (fairseq's convolutional model, OpenNMT-py's LSTM with attention)
against the model's own step loop, on the same weights, sources and thread count, side by side in one run.

    python -m benchmarks.toolkit_seq2seq_bench --out toolkit.json     # both models, full shapes: ~45-70 min on 2 cores
    python -m benchmarks.toolkit_seq2seq_bench --models lstm           # one of them
    python -m benchmarks.toolkit_seq2seq_bench --smoke                 # seconds, tiny shapes: the code runs

No server hosts these models but Quill; their peers are fairseq's `generate` and OpenNMT-py's `translate`, which
are not installable here. So the peer is what those toolkits do, written plainly in PyTorch over the same weights
(common/toolkit_loops.py): the encoder over the sources, then a per-step incremental decoder.

1. Shapes, random weights (fixed seed; matrices std 1/sqrt(fan-in), embeddings std 1, biases 0: greedy picks vary),
   float32, built as Quill's modules (the loop reads the same tensors):
   fconv: fairseq's `fconv_wmt_en_fr` (Gehring et al.'s WMT'14 En-Fr model): embeddings 768, both stacks
   [(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] + [(4096, 1)], attention on every decoder
   layer, decoder out embed 512, 40,000-token vocabularies.
   lstm: OpenNMT-py's rnn baseline: 2-layer bidirectional LSTM encoder, 2-layer LSTM decoder, hidden 500, word
   vectors 500, global attention "general", input feeding, 50,000 words (plus specials: source 50,002, target
   50,004).
2. 256 sources of 8-48 ids (uniform; fconv's ending in </s>, as fairseq appends it; OpenNMT's with nothing
   appended). Every source gets exactly 32 new tokens, greedy, the end token barred (the loop: its log-probability
   -inf at every step; Quill: min_tokens = max_tokens = 32), on --threads threads (torch.set_num_threads).
3. Per model, each repeat in turn (medians of --repeats):
   loop, one at a time: each source alone through the loop, the first --serial-sources of them (default 64: a
   sentence alone costs the same whichever it is, and all 256 would take longer than the rest together);
   loop, static 32: right-padded batches of 32 in the sources' order (masks on the padding), every row decoding
   its 32 tokens;
   Quill: every source sent at once to an in-process EngineCore (quill serve's scheduler settings: 64 sequences
   running, continuous batching; the encoder's output in its cache, decoder state in slots), stepped to the end.
   Every run times the encoder, the decoder steps and the greedy pick, from the first source to the last token.
4. Sentences/s and tokens/s of each, Quill's ratios to both loops (goal: >= 5x static batching), and how many
   sources' 32 greedy tokens are the same in the loop and in Quill (float32 on both sides: nearly all).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from quill.models.attention import select_attention_backend
from quill.models.classic.word_tokenizer import word_tokenizer
from quill.models.kernels import select_layer_ops
from quill.models.kernels.ops_linear import route_linears
from quill.models.loading.checkpoint import LoadedModel
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams

from .common import toolkit_loops as tl
from .common.hardware import describe_machine, load_average
from .common.seq2seq_runs import Offline
from .common.timing import write_json

MODELS = ("fconv", "lstm")
CONTENDERS = ("loop_one_at_a_time", "loop_static", "quill")


@dataclass(frozen=True, slots=True)
class Settings:
    name: str
    scale: int = 1  # > 1 divides every width and vocabulary
    sources: int = 256
    source_lens: tuple[int, int] = (8, 48)  # inclusive; fconv's </s> counted
    new_tokens: int = 32
    batch_size: int = 32  # the loop's static batches
    serial_sources: int | None = 64  # the first this many run one at a time (None: all)
    max_num_seqs: int = 64  # Quill's sequences running at once (quill serve's default)
    seed: int = 0


FULL = Settings("full")
SMOKE = Settings("smoke", scale=50, sources=6, source_lens=(3, 9), new_tokens=8, batch_size=4, serial_sources=None,
                 max_num_seqs=4)


def _build(name: str, s: Settings) -> tuple[object, object, LoadedModel, list[list[int]]]:
    """(config, loop, Quill's LoadedModel over the same module, sources) of one model."""
    if name == "fconv":
        config = tl.fconv_config(s.scale)
        words = ["<s>", "<pad>", "</s>", "<unk>"]
        eos, first_word, tail = tl.FAIRSEQ_EOS, 4, tl.FAIRSEQ_EOS
    else:
        config = tl.lstm_config(s.scale)
        words, eos, first_word, tail = tl.ONMT_SPECIALS, tl.ONMT_EOS, 2, None  # source specials: <unk>, <blank>
    model = tl.random_model(config, s.seed)
    # as the loader sets them; the loop calls the same nn.Linear modules, so it gets the ops' products there too
    model.attention_backend = select_attention_backend("auto", "cpu").name
    model.layer_ops = select_layer_ops("auto", "cpu")
    route_linears(model, model.layer_ops)
    loop = (tl.FConvLoop if name == "fconv" else tl.OpenNMTLoop)(model)
    words = words + [f"w{i}" for i in range(config.vocab_size - len(words))]
    tokenizer = word_tokenizer(words, unk_token=words[3] if name == "fconv" else words[0], eos_token=words[eos],
                               special_tokens=words[:4])
    loaded = LoadedModel(f"{name}-random", None, "seq2seq", model, tokenizer, [eos], torch.device("cpu"),
                         torch.float32)
    sources = tl.random_sources(s.sources, s.source_lens, config.source_vocab_size, first_word, tail, s.seed + 1)
    return config, loop, loaded, sources


def quill_offline(loaded: LoadedModel, sources: list[list[int]], new_tokens: int,
                  max_num_seqs: int) -> tuple[Offline, list[list[int]]]:
    """Every source at once through a fresh in-process engine, after an untimed warm-up on two others (the first two
    shortened by a token: the engine would reuse the encoder outputs of sources it has seen)."""
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0)
    engine = EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs, 2048, max(256, len(sources))),
                                             CacheConfig()))
    start_token = loaded.model.config.decoder_start_token_id
    _drive(engine, {f"w{i}": s[1:] for i, s in enumerate(sources[:2])}, start_token, SamplingParams(
        max_tokens=2, min_tokens=2, temperature=0))
    start = time.perf_counter()
    tokens = _drive(engine, {f"r{i}": s for i, s in enumerate(sources)}, start_token, params)
    seconds = time.perf_counter() - start
    outputs = [tokens[f"r{i}"] for i in range(len(sources))]
    if any(len(o) != new_tokens for o in outputs):
        raise RuntimeError(f"Quill returned other lengths than {new_tokens}: {sorted({len(o) for o in outputs})}")
    return Offline("quill", 1, len(sources), sum(map(len, outputs)), seconds), outputs


def _drive(engine: EngineCore, requests: dict[str, list[int]], start_token: int,
           params: SamplingParams) -> dict[str, list[int]]:
    for request_id, source in requests.items():
        engine.add_request(request_id, [start_token], params, encoder_token_ids=source)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            for c in out.outputs:
                tokens[out.request_id].extend(c.token_ids)
    return tokens


def agreement(reference: list[list[int]], quill: list[list[int]]) -> dict:
    """How many sources' tokens are the same, and where the others first differ."""
    same = sum(a == b for a, b in zip(reference, quill))
    first = [next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) for a, b in zip(reference, quill) if a != b]
    return {"sources": len(quill), "identical": same, "fraction": same / len(quill), "first_differences": first,
            "distinct_tokens": len({t for row in quill for t in row})}


def run_model(name: str, s: Settings, repeats: int, log) -> dict:
    config, loop, loaded, sources = _build(name, s)
    serial = sources[:s.serial_sources] if s.serial_sources else sources
    log(f"{name}: {sum(p.numel() for p in loaded.model.parameters()) / 1e6:.1f} M parameters, {len(sources)} "
        f"sources ({len(serial)} one at a time), {s.new_tokens} new tokens each")
    runs = {
        "loop_one_at_a_time": lambda: tl.loop_offline(loop, "loop_one_at_a_time", serial, s.new_tokens, 1),
        "loop_static": lambda: tl.loop_offline(loop, "loop_static", sources, s.new_tokens, s.batch_size),
        "quill": lambda: quill_offline(loaded, sources, s.new_tokens, s.max_num_seqs),
    }
    figures, outputs = {k: [] for k in runs}, {}
    for repeat in range(repeats):  # in turn, so that drift in the machine's load reaches all alike
        for contender, fn in runs.items():
            figure, outputs[contender] = fn()
            figures[contender].append(figure.to_dict())
            log(f"  repeat {repeat + 1}/{repeats}: {contender}: {figure.sentences / figure.seconds:.2f} sentences/s, "
                f"{figure.generated_tokens / figure.seconds:.1f} tokens/s ({figure.seconds:.1f} s)")
    medians = {k: {rate: statistics.median(f[rate] for f in v) for rate in ("sentences_per_s", "tokens_per_s")}
               for k, v in figures.items()}
    quill = medians["quill"]["sentences_per_s"]
    return {
        "config": {k: v for k, v in asdict(config).items() if k not in ("encoder_layers", "decoder_layers")}
        | {"layers": config.encoder_layers if name == "fconv" else config.layers},
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "workload": {"sources": len(sources), "one_at_a_time_sources": len(serial),
                     "source_tokens": sum(map(len, sources)), "source_lens": [min(map(len, sources)),
                                                                              max(map(len, sources))],
                     "new_tokens": s.new_tokens, "batch_size": s.batch_size, "quill_max_num_seqs": s.max_num_seqs},
        "runs": figures, "medians": medians,
        "quill_over_static": quill / medians["loop_static"]["sentences_per_s"],
        "quill_over_one_at_a_time": quill / medians["loop_one_at_a_time"]["sentences_per_s"],
        "agreement": {"loop_static": agreement(outputs["loop_static"], outputs["quill"]),
                      "loop_one_at_a_time": agreement(outputs["loop_one_at_a_time"],
                                                      outputs["quill"][:len(serial)])},
    }


def run(s: Settings, models: list[str], threads: int, repeats: int, log=print) -> dict:
    """The whole benchmark (see the module docstring); every figure, JSON-ready."""
    torch.set_num_threads(threads)
    machine = describe_machine() | {"load_average": load_average()}
    results = {"benchmark": "toolkit_seq2seq_bench", "preset": s.name, "settings": asdict(s), "threads": threads,
               "repeats": repeats, "machine": machine, "dtype": "float32", "models": {}}
    for name in models:
        results["models"][name] = run_model(name, s, repeats, log)
    machine["load_average_end"] = load_average()
    return results


def render(results: dict) -> str:
    m = results["machine"]
    lines = [f"{m['cpu']}, {m['cores']} cores, {results['threads']} threads, torch {m['torch']}; medians of "
             f"{results['repeats']}; load {m['load_average']} -> {m.get('load_average_end')}", "",
             f"{'model':<6} {'run':<20} {'sentences/s':>12} {'tokens/s':>10}  Quill is"]
    for name, r in results["models"].items():
        for contender in CONTENDERS:
            f = r["medians"][contender]
            ratio = "" if contender == "quill" else \
                f"{r['medians']['quill']['sentences_per_s'] / f['sentences_per_s']:.2f}x"
            lines.append(f"{name:<6} {contender:<20} {f['sentences_per_s']:>12.2f} {f['tokens_per_s']:>10.1f}  {ratio}")
        a = r["agreement"]["loop_static"]
        goal = "met" if r["quill_over_static"] >= 5 else "not met"
        lines.append(f"{name:<6} greedy tokens the same as the loop's for {a['identical']}/{a['sources']} sources "
                     f"({a['distinct_tokens']} distinct tokens); goal >= 5x static batching: {goal}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.toolkit_seq2seq_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"some of {','.join(MODELS)} (default both)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every run (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, medians reported (default 3)")
    parser.add_argument("--sources", type=int, help=f"sources (default {FULL.sources})")
    parser.add_argument("--serial-sources", type=int, help="of them, how many the one-at-a-time loop runs "
                                                           f"(default {FULL.serial_sources})")
    parser.add_argument("--max-num-seqs", type=int, help=f"Quill's running sequences (default {FULL.max_num_seqs})")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny shapes, 6 sources; measures nothing")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS):
        parser.error(f"--models takes some of {','.join(MODELS)}, not {args.models!r}")
    if any(n is not None and n < 1 for n in (args.sources, args.serial_sources, args.max_num_seqs, args.threads)):
        parser.error("--sources, --serial-sources, --max-num-seqs and --threads take positive counts")
    s = SMOKE if args.smoke else FULL
    s = replace(s, **{k: v for k, v in (("sources", args.sources), ("serial_sources", args.serial_sources),
                                        ("max_num_seqs", args.max_num_seqs)) if v is not None})
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    results = run(s, models, args.threads, 1 if args.smoke else args.repeats, log)
    print(render(results))
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
