"""The training loop: AdamW, warmup + cosine schedule, clipping, random windows, periodic exact eval."""

import functools
import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from quill.models.threads import ThreadTuner, available_cores
from quill.models.training.evaluation import perplexity
from quill.models.training.machine import describe_machine


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    context: int = 256  # tokens per training window; also the eval window
    batch_size: int = 16
    max_steps: int = 3000
    max_minutes: float | None = None  # wall-clock budget for the whole job, evals included
    learning_rate: float = 2e-3
    min_learning_rate: float = 2e-4  # where the cosine ends
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices and embeddings only, never on biases and norm gains
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 500
    eval_batch_size: int = 16
    seed: int = 1337
    # bfloat16 autocast for the training forward pass (weights and optimizer stay float32):
    # ~1.6x faster on a CPU with AVX512-BF16; evaluation always runs in float32.
    autocast_bfloat16: bool = True
    num_threads: int | None = None  # None: re-picked from measured step times (see quill/models/threads.py)

    def __post_init__(self):
        if min(self.context, self.batch_size, self.max_steps, self.eval_every, self.eval_batch_size) < 1:
            raise ValueError("context, batch sizes, max_steps and eval_every must be at least 1")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError("max_minutes must be positive")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise ValueError("need 0 <= min_learning_rate <= learning_rate")
        if self.warmup_steps < 0 or self.grad_clip <= 0:
            raise ValueError("warmup_steps must be >= 0 and grad_clip > 0")


@dataclass(slots=True)
class TrainingRecord:
    parameters: int
    steps: int
    tokens_seen: int
    training_seconds: float
    validation_perplexity: float
    stopped_by: str  # "steps" or "time"
    steps_per_thread_count: dict[int, int] = field(default_factory=dict)
    validation_history: list[tuple[int, float]] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters, so tied embeddings count once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def learning_rate_at(step: int, progress: float, config: TrainingConfig) -> float:
    """Linear warmup over steps, then cosine from peak to min over `progress` in [0, 1].

    `progress` is the larger of the step fraction and the time fraction, so a run cut short by
    its wall-clock budget still anneals to the minimum instead of stopping at a high rate.
    """
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return config.min_learning_rate + cosine * (config.learning_rate - config.min_learning_rate)


def build_optimizer(model: torch.nn.Module, config: TrainingConfig) -> torch.optim.AdamW:
    unique = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decayed = [p for p in unique if p.dim() >= 2]
    undecayed = [p for p in unique if p.dim() < 2]
    groups = [
        {"params": decayed, "weight_decay": config.weight_decay},
        {"params": undecayed, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas)


def sample_windows(ids: torch.Tensor, context: int, batch_size: int, generator: torch.Generator):
    """(inputs, targets), each (B, C): random windows of the stream, targets shifted by one."""
    starts = torch.randint(0, ids.numel() - context, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(context + 1)  # (B, C + 1)
    windows = ids[offsets]
    return windows[:, :-1], windows[:, 1:]


def train(
    model: torch.nn.Module,
    train_ids: torch.Tensor,
    validation_ids: torch.Tensor,
    config: TrainingConfig,
    device: str = "cpu",
    progress_description: str = "train",
) -> TrainingRecord:
    """Train `model` (forward: (B, T) ids -> (B, T, V) logits) in place and return what happened.

    train_ids / validation_ids are 1-D int64 token streams. Validation perplexity is exact over the
    whole held-out stream (see evaluation.mean_nll), measured every `eval_every` steps and at the end.
    """
    if train_ids.numel() <= config.context:
        raise ValueError(f"training stream ({train_ids.numel()} tokens) is not longer than the context")
    previous_threads = torch.get_num_threads()
    try:
        return _train(model, train_ids.cpu(), validation_ids.to(device), config, device, progress_description)
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    model: torch.nn.Module,
    train_ids: torch.Tensor,
    validation_ids: torch.Tensor,
    config: TrainingConfig,
    device: str,
    progress_description: str,
) -> TrainingRecord:
    model.to(device).train()
    optimizer = build_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    budget_seconds = config.max_minutes * 60 if config.max_minutes else math.inf
    tokens_per_step = config.batch_size * config.context
    evaluate = functools.partial(perplexity, model, validation_ids, config.context, config.eval_batch_size)
    tuner = ThreadTuner([config.num_threads]) if config.num_threads else ThreadTuner.for_cores(available_cores())

    history: list[tuple[int, float]] = []
    validation_ppl = math.nan
    eval_seconds = 0.0  # all evaluations so far
    last_eval_seconds = None
    stopped_by = "steps"
    step = 0
    start = time.perf_counter()
    bar = tqdm(total=config.max_steps, desc=progress_description, mininterval=2.0, dynamic_ncols=True)
    while step < config.max_steps:
        elapsed = time.perf_counter() - start
        # Keep room in the budget for the final evaluation. Before the first one, guess from training
        # speed: a forward pass costs about a third of a training step.
        tokens_per_second = step * tokens_per_step / max(elapsed - eval_seconds, 1e-9)
        final_eval_seconds = last_eval_seconds or (validation_ids.numel() / tokens_per_second / 3 if step else 0.0)
        training_budget = budget_seconds - final_eval_seconds
        if step > 0 and elapsed >= training_budget:
            stopped_by = "time"
            break
        progress = max(step / config.max_steps, elapsed / training_budget)
        lr = learning_rate_at(step, progress, config)
        for group in optimizer.param_groups:
            group["lr"] = lr

        threads = tuner.next_threads()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        step_start = time.perf_counter()
        inputs, targets = sample_windows(train_ids, config.context, config.batch_size, generator)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=config.autocast_bfloat16):
            logits = model(inputs.to(device))  # (B, C, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.to(device).flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        tuner.record(threads, time.perf_counter() - step_start)
        step += 1

        if step % config.eval_every == 0 and step < config.max_steps:
            torch.set_num_threads(tuner.chosen)
            eval_start = time.perf_counter()
            validation_ppl = evaluate()
            last_eval_seconds = time.perf_counter() - eval_start
            eval_seconds += last_eval_seconds
            history.append((step, validation_ppl))
        bar.update(1)
        bar.set_postfix(
            loss=f"{loss.item():.3f}",
            tok_s=f"{tokens_per_second:,.0f}",
            val_ppl=f"{validation_ppl:.1f}",
            lr=f"{lr:.1e}",
            threads=threads,
            refresh=False,
        )

    if not history or history[-1][0] != step:  # the clock may stop a run right after an evaluation
        torch.set_num_threads(tuner.chosen)
        validation_ppl = evaluate()
        history.append((step, validation_ppl))
    bar.set_postfix(val_ppl=f"{validation_ppl:.1f}")
    bar.close()
    return TrainingRecord(
        parameters=count_parameters(model),
        steps=step,
        tokens_seen=step * tokens_per_step,
        training_seconds=round(time.perf_counter() - start, 1),
        validation_perplexity=validation_ppl,
        stopped_by=stopped_by,
        steps_per_thread_count=dict(sorted(tuner.steps_per_count.items())),
        validation_history=history,
        machine=describe_machine(device),
        config=asdict(config),
    )
