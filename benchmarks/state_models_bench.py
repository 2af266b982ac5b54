"""Mamba and xLSTM served by Quill on the CPU, beside transformers `generate()` on the same random weights, in one
run: 64 concurrent requests (Quill's engine against `generate()` one at a time and in static batches), and a
multi-turn chat whose second turn resumes from the first's saved state (prefix caching on against off).

    python -m benchmarks.state_models_bench --threads 2 --out runs/state_models.json   # both shapes, ~15 min on 2 cores
    python -m benchmarks.state_models_bench --shapes xlstm --parts chat --repeats 5      # one shape, one part
    python -m benchmarks.state_models_bench --smoke                                     # seconds: tiny shapes

Shapes (random weights, float32; built with transformers' classes, saved with `save_pretrained` beside a byte-level
tokenizer.json, loaded by Quill with `load_checkpoint` and run by transformers as the model object that saved them):
- `mamba`: state-spaces/mamba-130m-hf's shape, `MambaForCausalLM` (hidden 768, 24 layers, state 16, expand 2,
  conv 4, vocabulary 50,280, tied embeddings);
- `xlstm`: a 125M-class `xLSTMForCausalLM` with xLSTM-7b's structure (embedding 768, 12 blocks, 4 heads,
  qk_dim_factor 0.5, v_dim_factor 1, feed-forward 2.667 -> 2,048, xLSTM-7b's vocabulary of 50,304, untied head);
  input and forget gates drawn at random (transformers starts them at zero weights).

Parts (`--parts`):
- `throughput`: 64 requests from a seed, random token-id prompts of 16-128 tokens, max_tokens 16-128, greedy, EOS
  ignored (every request generates exactly max_tokens), the same requests for every contender. Quill: all 64
  submitted at once to one engine (max_num_seqs 64), with prefix caching on (the default) and off, a fresh engine
  each run, warmed on other prompts. transformers: `generate()` one request at a time (`--serial-requests` of the 64,
  spread over the max_tokens range; a rate per token), and static batches of 8 and of 64: the requests sorted by
  prompt length, then cut into batches, so that a batch's prompts are alike and left-padding is short; each batch runs
  to its longest max_tokens. transformers' Mamba zeroes padded positions by the attention mask; its xLSTM takes no
  mask and runs the pad tokens as input: either way, the padding, and the positions computed past a row's max_tokens,
  are part of what static batching costs and are timed. Output tokens/s counts the tokens asked for.
  Sanity: the greedy tokens of the requests transformers ran one at a time, against Quill's for the same requests.
- `chat`: a conversation whose first turn is a `--chat-prompt`-token prompt (2,000) answered with `--chat-answer`
  tokens (32); the second turn's prompt is the first's, its answer and `--chat-new` new tokens (50). Time to the
  first token of the second turn, and to its whole answer, with prefix caching on and off, each on a fresh engine
  (`quill serve`'s scheduler defaults) warmed on another prompt first; on, off, on, off, ... `--repeats` times.

Every part runs its contenders in turn each repeat (Quill, transformers, Quill, ...), so that other work on a shared
machine slows them alike; figures are medians over the repeats, ratios are ratios of medians. `--threads` sets
`torch.set_num_threads` for both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from clients.bench.workload import TargetModel, WorkloadSpec, build_requests
from models.checkpoint import LoadedModel, load_checkpoint
from server.engine.core import CacheConfig, EngineConfig, EngineCore
from server.engine.scheduler import SchedulerConfig
from server.sampling import SamplingParams

from . import hf_runs, quill_runs
from .checkpoints import build_tokenizer
from .hardware import describe_machine, load_average
from .tokenized import TokenizedRequest, num_generated, spread_subset, tokenize

PAD_ID = 0  # the tokenizer's end-of-text: never in a prompt (prompts are ids 1 and up), never a stop (EOS ignored)

# name -> (transformers config class, model class, config keyword arguments)
SHAPES = {
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(
        vocab_size=50280, hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4)),
    "xlstm": ("xLSTMConfig", "xLSTMForCausalLM", dict(
        vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_heads=4, qk_dim_factor=0.5, v_dim_factor=1.0)),
}
SMOKE_SHAPES = {
    "mamba": dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4),
    "xlstm": dict(vocab_size=300, hidden_size=128, num_hidden_layers=2, num_heads=4, chunk_size=8),  # transformers' cache rounds q/k up to 64
}
PARTS = ("throughput", "chat")


@dataclass(frozen=True)
class Settings:
    requests: int = 64
    prompt_len: tuple[int, int] = (16, 128)
    max_tokens: tuple[int, int] = (16, 128)
    serial_requests: int = 8  # of the 64, through generate() one at a time (a rate per token)
    batch_sizes: tuple[int, ...] = (8, 64)
    repeats: int = 3
    chat_prompt: int = 2000
    chat_answer: int = 32
    chat_new: int = 50
    chat_repeats: int = 3
    seed: int = 0


SMOKE = Settings(requests=6, prompt_len=(3, 10), max_tokens=(2, 6), serial_requests=2, batch_sizes=(2, 6),
                 repeats=1, chat_prompt=40, chat_answer=4, chat_new=6, chat_repeats=1)


# ---- models ---------------------------------------------------------------------------------


def save_random(directory: Path, shape: str, config_kwargs: dict, seed: int = 0):
    """transformers' model of `shape` with random weights, saved with a tokenizer.json; returns it (eval, float32)."""
    import transformers

    config_name, model_name, _ = SHAPES[shape]
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**config_kwargs, bos_token_id=PAD_ID, eos_token_id=PAD_ID,
                                                pad_token_id=PAD_ID)
    model = getattr(transformers, model_name)(config).eval().requires_grad_(False)
    if shape == "xlstm":
        with torch.no_grad():  # transformers starts the input and forget gates at zero weights (and -10 biases)
            for name, param in model.named_parameters():
                if "gate_preact" in name and "ogate" not in name:
                    param.normal_(0.0, 0.02 if name.endswith("weight") else 1.0)
    model.generation_config.eos_token_id = None  # never stop early: exactly max_tokens, as Quill's ignore_eos
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(directory)
    build_tokenizer(config.vocab_size).save(str(Path(directory) / "tokenizer.json"))
    return model


def build(shape: str, smoke: bool, directory: Path) -> tuple[object, LoadedModel]:
    """(transformers' model, Quill's load of the same directory)."""
    kwargs = SMOKE_SHAPES[shape] if smoke else SHAPES[shape][2]
    reference = save_random(directory, shape, kwargs)
    return reference, load_checkpoint(directory, device="cpu", dtype="float32", name=f"{shape}-random")


# ---- workloads -----------------------------------------------------------------------------


def workload(s: Settings, vocab_size: int, salt: int = 0, **changes) -> list[TokenizedRequest]:
    """The throughput requests (greedy, token-id prompts, EOS ignored); `salt` draws other ones (warm-ups)."""
    spec = replace(WorkloadSpec(s.requests, s.prompt_len, s.max_tokens, models=["bench"], seed=s.seed,
                                prompts="ids"), **changes)
    target = TargetModel(s.prompt_len[1] + s.max_tokens[1] + 2, vocab_size=vocab_size)
    return tokenize(build_requests(spec, {"bench": target}, salt), tag=f"s{salt}-r")


def engine(loaded: LoadedModel, prefix_caching: bool, max_num_seqs: int | None = None) -> EngineCore:
    """A fresh engine with `quill serve`'s defaults but for prefix caching (and the number of sequences)."""
    scheduler = SchedulerConfig() if max_num_seqs is None else SchedulerConfig(max_num_seqs=max_num_seqs)
    return EngineCore(loaded, EngineConfig(scheduler, CacheConfig(enable_prefix_caching=prefix_caching)))


def interleaved(contenders: dict, repeats: int, log) -> dict[str, list]:
    """name -> the results of each repeat, the contenders called in turn every repeat."""
    results: dict[str, list] = {name: [] for name in contenders}
    for repeat in range(repeats):
        for name, fn in contenders.items():
            results[name].append(fn())
            log(f"  repeat {repeat + 1}/{repeats}: {name}: {describe_result(results[name][-1])}")
    return results


def describe_result(result) -> str:
    if isinstance(result, dict) and "tokens_per_s" in result:
        return f"{result['tokens_per_s']:.1f} output tokens/s in {result['seconds']:.1f} s"
    if isinstance(result, dict) and "first_token_s" in result:
        return f"second turn: first token after {1e3 * result['first_token_s']:.0f} ms, answer after " \
               f"{result['answer_s']:.2f} s ({result['prefix_hit_tokens']} prompt tokens resumed)"
    return str(result)


# ---- part 1: throughput --------------------------------------------------------------------


def throughput(s: Settings, reference, loaded: LoadedModel, log) -> dict:
    vocab = loaded.model.config.vocab_size
    requests = workload(s, vocab)
    warmup = workload(s, vocab, salt=1, num_requests=min(4, s.requests), max_tokens=(2, 2))
    serial_subset = spread_subset(requests, s.serial_requests)
    by_length = sorted(requests, key=lambda r: len(r.prompt_token_ids))  # static batches of alike prompts
    quill_tokens: dict[str, list[int]] = {}
    hf_tokens: dict[str, list[int]] = {}

    def quill(prefix_caching: bool):
        def run() -> dict:
            core = engine(loaded, prefix_caching, max_num_seqs=s.requests)
            tokens: dict[str, list[int]] = {}
            out = quill_runs.engine_throughput(core, requests, warmup, tokens=tokens)
            if prefix_caching and not quill_tokens:
                quill_tokens.update(tokens)
            if core.cache.usage != 0:
                raise RuntimeError(f"cache usage {core.cache.usage} after every request finished")
            return out.to_dict(prefix_hit_tokens=core.cache.prefix_hits)
        return run

    def static(batch_size: int):
        return lambda: hf_runs.static_batches(reference, by_length, batch_size, PAD_ID).to_dict()

    contenders = {"quill": quill(True)}
    contenders |= {f"transformers_static_{b}": static(b) for b in s.batch_sizes}
    contenders["quill_prefix_caching_off"] = quill(False)
    contenders["transformers_one_at_a_time"] = lambda: hf_runs.serial(reference, serial_subset, PAD_ID,
                                                                      tokens=hf_tokens).to_dict()
    runs = interleaved(contenders, s.repeats, log)
    medians = {name: statistics.median(r["tokens_per_s"] for r in results) for name, results in runs.items()}
    ratios = {f"quill_vs_{name.removeprefix('transformers_')}": medians["quill"] / medians[name]
              for name in medians if name.startswith("transformers_")}
    ratios["prefix_caching_on_vs_off"] = medians["quill"] / medians["quill_prefix_caching_off"]
    return {
        "workload": {"requests": len(requests), "prompt_len": list(s.prompt_len), "max_tokens": list(s.max_tokens),
                     "output_tokens": num_generated(requests),
                     "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
                     "serial_requests": [r.request_id for r in serial_subset], "seed": s.seed},
        "runs": runs, "median_tokens_per_s": medians, "ratios": ratios,
        "greedy_check": greedy_check(serial_subset, quill_tokens, hf_tokens),
    }


def greedy_check(requests: list[TokenizedRequest], quill: dict, hf: dict) -> dict:
    """Quill's greedy tokens (64 at once) against transformers' (one at a time, no padding), request by request."""
    per_request = {}
    for r in requests:
        ours, theirs = quill[r.request_id], hf[r.request_id]
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        per_request[r.request_id] = {"tokens": len(theirs), "equal": ours == theirs, "first_difference": first,
                                     "distinct_tokens": len(set(theirs))}
    return {"requests": len(per_request), "equal": sum(v["equal"] for v in per_request.values()),
            "per_request": per_request}


# ---- part 2: a chat's second turn ----------------------------------------------------------


def timed_turn(core: EngineCore, request_id: str, prompt: list[int], max_tokens: int) -> dict:
    """Run one request alone to its end: seconds to its first token and to its last, its tokens."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    hits_before = core.cache.prefix_hits
    start = time.perf_counter()
    core.add_request(request_id, prompt, params)
    first, tokens = None, []
    while core.has_work():
        for out in core.step():
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            tokens += out.outputs[0].token_ids
        if tokens and first is None:
            first = time.perf_counter() - start
    if len(tokens) != max_tokens:
        raise RuntimeError(f"{request_id} generated {len(tokens)} of {max_tokens} tokens")
    return {"first_token_s": first, "answer_s": time.perf_counter() - start, "tokens": tokens,
            "prefix_hit_tokens": core.cache.prefix_hits - hits_before}


def chat(s: Settings, loaded: LoadedModel, log) -> dict:
    vocab = loaded.model.config.vocab_size
    rng = torch.Generator().manual_seed(s.seed + 7)
    first_prompt = torch.randint(1, vocab, (s.chat_prompt,), generator=rng).tolist()
    new_tokens = torch.randint(1, vocab, (s.chat_new,), generator=rng).tolist()
    warm_prompt = torch.randint(1, vocab, (64,), generator=rng).tolist()

    def conversation(prefix_caching: bool):
        def run() -> dict:
            core = engine(loaded, prefix_caching)
            timed_turn(core, "warm-up", warm_prompt, 4)  # a prefill chunk and decode steps, on another prompt
            turn1 = timed_turn(core, "turn-1", first_prompt, s.chat_answer)
            second_prompt = first_prompt + turn1["tokens"] + new_tokens
            turn2 = timed_turn(core, "turn-2", second_prompt, s.chat_answer)
            return {"first_token_s": turn2["first_token_s"], "answer_s": turn2["answer_s"],
                    "prefix_hit_tokens": turn2["prefix_hit_tokens"], "second_prompt_tokens": len(second_prompt),
                    "turn1_first_token_s": turn1["first_token_s"], "turn1_answer_s": turn1["answer_s"],
                    "answer": turn2["tokens"]}
        return run

    runs = interleaved({"prefix_caching_on": conversation(True), "prefix_caching_off": conversation(False)},
                       s.chat_repeats, log)
    on, off = runs["prefix_caching_on"], runs["prefix_caching_off"]
    if any(r["answer"] != on[0]["answer"] for r in on + off):
        raise RuntimeError("the second turn's answer differs between runs: resuming changed the result")
    for r in on + off:
        del r["answer"]
    med = {name: {key: statistics.median(r[key] for r in results) for key in ("first_token_s", "answer_s")}
           for name, results in runs.items()}
    return {
        "conversation": {"first_prompt_tokens": s.chat_prompt, "answer_tokens": s.chat_answer,
                         "new_tokens": s.chat_new, "second_prompt_tokens": on[0]["second_prompt_tokens"]},
        "runs": runs, "medians": med,
        "first_token_speedup": med["prefix_caching_off"]["first_token_s"] / med["prefix_caching_on"]["first_token_s"],
        "answer_speedup": med["prefix_caching_off"]["answer_s"] / med["prefix_caching_on"]["answer_s"],
    }


# ---- the run -----------------------------------------------------------------------------


def run(args: argparse.Namespace, log=print) -> dict:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    s = SMOKE if args.smoke else Settings()
    s = replace(s, **{k: v for k, v in dict(
        repeats=args.repeats, chat_repeats=args.chat_repeats or args.repeats, serial_requests=args.serial_requests,
        chat_prompt=args.chat_prompt).items() if v is not None})
    results = {"machine": describe_machine(), "load_average_start": load_average(), "settings": asdict(s),
               "smoke": args.smoke, "shapes": {}}
    log(f"{results['machine']['cpu']}, {results['machine']['cores']} cores, torch {results['machine']['torch']} "
        f"with {torch.get_num_threads()} threads, load average {results['load_average_start']}")
    for shape in args.shapes:
        with tempfile.TemporaryDirectory(prefix=f"quill-bench-{shape}-") as tmp:
            reference, loaded = build(shape, args.smoke, Path(tmp))
        out = results["shapes"][shape] = {
            "config": SMOKE_SHAPES[shape] if args.smoke else SHAPES[shape][2],
            "parameters": loaded.num_parameters,
            "state_bytes_per_sequence": loaded.model.new_state(1).bytes_per_slot,
        }
        log(f"{shape}: {loaded.num_parameters / 1e6:.1f}M parameters, "
            f"{out['state_bytes_per_sequence']:,} state bytes a sequence")
        part_seconds = out["part_seconds"] = {}
        for part in PARTS:
            if part not in args.parts:
                continue
            start = time.perf_counter()
            log(f"{shape}: {part}")
            out[part] = throughput(s, reference, loaded, log) if part == "throughput" else chat(s, loaded, log)
            part_seconds[part] = time.perf_counter() - start
            out["load_average_after"] = load_average()
    results["load_average_end"] = load_average()
    return results


def summary(results: dict) -> str:
    """The figures as a Markdown table, one block a shape."""
    lines = []
    for shape, out in results["shapes"].items():
        lines.append(f"\n{shape}: {out['parameters'] / 1e6:.1f}M parameters")
        if "throughput" in out:
            t = out["throughput"]
            med, ratios = t["median_tokens_per_s"], t["ratios"]
            lines += ["| contender | output tokens/s (median) | Quill / it |", "| --- | --- | --- |"]
            for name, value in med.items():
                ratio = ratios.get(f"quill_vs_{name.removeprefix('transformers_')}") if name != "quill" else 1.0
                if name == "quill_prefix_caching_off":
                    ratio = ratios["prefix_caching_on_vs_off"]
                lines.append(f"| {name} | {value:,.1f} | {ratio:.2f}x |")
            g = t["greedy_check"]
            lines.append(f"greedy tokens equal to transformers' for {g['equal']} of {g['requests']} requests")
        if "chat" in out:
            c = out["chat"]
            on, off = c["medians"]["prefix_caching_on"], c["medians"]["prefix_caching_off"]
            lines.append(f"second turn ({c['conversation']['second_prompt_tokens']} tokens): first token "
                         f"{1e3 * on['first_token_s']:.0f} ms with prefix caching, {1e3 * off['first_token_s']:.0f} ms "
                         f"without ({c['first_token_speedup']:.1f}x); whole answer {on['answer_s']:.2f} s against "
                         f"{off['answer_s']:.2f} s ({c['answer_speedup']:.1f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_models_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeats", type=int, help="throughput repeats (default 3)")
    parser.add_argument("--chat-repeats", type=int, help="chat repeats (default: --repeats, else 3)")
    parser.add_argument("--serial-requests", type=int, help="requests run one at a time by transformers (default 8)")
    parser.add_argument("--chat-prompt", type=int, help="the first turn's prompt tokens (default 2000)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and requests: checks that it runs")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = run(args)
    print(summary(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
