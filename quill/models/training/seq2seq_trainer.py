"""The training loop for an encoder-decoder on (source ids, target ids) pairs: the language models' optimizer,
schedule, clipping, thread tuning and wall-clock budget (trainer.py), over batches of pairs of similar length.

A TrainingConfig reads here as: batch_size pairs a step, eval_batch_size pairs an evaluation batch, and `context`
the most tokens a source or a target (its end token included) may have to be trained on.
"""

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from quill.models.threads import ThreadTuner, available_cores
from quill.models.training.machine import describe_machine
from quill.models.training.trainer import (TrainingConfig, TrainingRecord, build_optimizer, count_parameters,
                                           learning_rate_at)

EncodedPair = tuple[list[int], list[int]]  # source ids (its suffix included), target ids (no start, no end)


@dataclass(frozen=True, slots=True)
class SpecialIds:
    pad: int
    start: int  # the decoder's first input
    eos: int  # the last token each target is trained to produce


def collate(pairs: list[EncodedPair], ids: SpecialIds, device: str = "cpu"):
    """-> sources (B, S), source_lengths (B,), decoder inputs (B, T) = start + target, and what each input position
    should predict (B, T) = target + eos; all right-padded with pad (which the loss ignores)."""
    width_s = max(len(s) for s, _ in pairs)
    width_t = max(len(t) for _, t in pairs) + 1
    sources = [s + [ids.pad] * (width_s - len(s)) for s, _ in pairs]
    inputs = [[ids.start] + t + [ids.pad] * (width_t - 1 - len(t)) for _, t in pairs]
    labels = [t + [ids.eos] + [ids.pad] * (width_t - 1 - len(t)) for _, t in pairs]
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    return as_tensor(sources), as_tensor([len(s) for s, _ in pairs]), as_tensor(inputs), as_tensor(labels)


def length_batches(pairs: list[EncodedPair], batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch of batches: shuffled, then sorted by length within pools of 64 batches (little padding), the
    batches in random order."""
    order = torch.randperm(len(pairs), generator=generator).tolist()
    pool = 64 * batch_size
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: (len(pairs[i][1]), len(pairs[i][0])))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def batch_nll(model, forward, pairs: list[EncodedPair], ids: SpecialIds, device: str) -> tuple[torch.Tensor, int]:
    """(summed NLL in nats over every target token and each end token, how many)."""
    sources, lengths, inputs, labels = collate(pairs, ids, device)
    log_probs = forward(model, sources, lengths, inputs)  # (B, T, V)
    nll = F.nll_loss(log_probs.flatten(0, 1), labels.flatten(), ignore_index=ids.pad, reduction="sum")
    return nll, int((labels != ids.pad).sum())


@torch.no_grad()
def mean_nll(model, forward, pairs: list[EncodedPair], ids: SpecialIds, batch_size: int, device: str = "cpu") -> float:
    """Mean NLL per predicted target token (the end tokens included), teacher forced, in float32."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][1]))
    total, count = 0.0, 0
    for start in range(0, len(order), batch_size):
        nll, n = batch_nll(model, forward, [pairs[i] for i in order[start : start + batch_size]], ids, device)
        total, count = total + nll.item(), count + n
    model.train(was_training)
    return total / count


def train_pairs(model, forward, train: list[EncodedPair], validation: list[EncodedPair], ids: SpecialIds,
                config: TrainingConfig, device: str = "cpu", progress_description: str = "train") -> TrainingRecord:
    """Train `model` in place through `forward` (seq2seq_forward.py) and return what happened; the validation
    perplexity is exp(mean_nll) over every held-out pair, measured every `eval_every` steps and at the end."""
    previous_threads = torch.get_num_threads()
    try:
        return _train(model, forward, train, validation, ids, config, device, progress_description)
    finally:
        torch.set_num_threads(previous_threads)


def _train(model, forward, train, validation, ids, config, device, progress_description) -> TrainingRecord:
    train = [(s, t) for s, t in train if len(s) <= config.context and len(t) < config.context]
    model.to(device).train()
    optimizer = build_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    budget_seconds = config.max_minutes * 60 if config.max_minutes else math.inf
    tuner = ThreadTuner([config.num_threads]) if config.num_threads else ThreadTuner.for_cores(available_cores())

    def evaluate() -> float:
        torch.set_num_threads(tuner.chosen)
        return math.exp(mean_nll(model, forward, validation, ids, config.eval_batch_size, device))

    validation_tokens = sum(len(t) + 1 for _, t in validation)
    history: list[tuple[int, float]] = []
    validation_ppl, eval_seconds, last_eval_seconds = math.nan, 0.0, None
    stopped_by, step, tokens_seen, epoch = "steps", 0, 0, []
    start = time.perf_counter()
    bar = tqdm(total=config.max_steps, desc=progress_description, mininterval=2.0, dynamic_ncols=True)
    while step < config.max_steps:
        elapsed = time.perf_counter() - start
        # Room for the final evaluation; before the first, a guess: a forward pass is about a third of a step.
        tokens_per_second = tokens_seen / max(elapsed - eval_seconds, 1e-9)
        final_eval_seconds = last_eval_seconds or (validation_tokens / tokens_per_second / 3 if step else 0.0)
        training_budget = budget_seconds - final_eval_seconds
        if step > 0 and elapsed >= training_budget:
            stopped_by = "time"
            break
        lr = learning_rate_at(step, max(step / config.max_steps, elapsed / training_budget), config)
        for group in optimizer.param_groups:
            group["lr"] = lr

        if not epoch:
            epoch = length_batches(train, config.batch_size, generator)
        threads = tuner.next_threads()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        step_start = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=config.autocast_bfloat16):
            nll, count = batch_nll(model, forward, [train[i] for i in epoch.pop()], ids, device)
        loss = nll / count
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        tuner.record(threads, (time.perf_counter() - step_start) / count)  # per token: batches differ in length
        step, tokens_seen = step + 1, tokens_seen + count

        if step % config.eval_every == 0 and step < config.max_steps:
            eval_start = time.perf_counter()
            validation_ppl = evaluate()
            last_eval_seconds = time.perf_counter() - eval_start
            eval_seconds += last_eval_seconds
            history.append((step, validation_ppl))
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens_per_second:,.0f}", val_ppl=f"{validation_ppl:.2f}",
                        lr=f"{lr:.1e}", threads=threads, refresh=False)

    if not history or history[-1][0] != step:
        validation_ppl = evaluate()
        history.append((step, validation_ppl))
    bar.close()
    return TrainingRecord(
        parameters=count_parameters(model), steps=step, tokens_seen=tokens_seen,
        training_seconds=round(time.perf_counter() - start, 1), validation_perplexity=validation_ppl,
        stopped_by=stopped_by, steps_per_thread_count=dict(sorted(tuner.steps_per_count.items())),
        validation_history=history, machine=describe_machine(device), config=asdict(config),
    )
