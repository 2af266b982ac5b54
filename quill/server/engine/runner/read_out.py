"""What a step brings back to the host: the sampled tokens, beam candidates and prompt scores, queued on the
device and copied back in one transfer, then read into a `StepResult` once the copy has arrived."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from quill.server.sampling import prompt_logprobs, sample
from quill.server.sampling.beam import BeamRequest, beam_candidates
from quill.server.sampling.coverage import coverage_penalty

from ..grammar_masks import PendingMasks
from ..outputs import TokenLogprob
from ..scheduler import ScheduledBatch
from ..sequence import Sequence, SequenceGroup
from .inputs import LogitRows
from .sampling_plan import SamplingPlan


@dataclass(slots=True)
class Sampled:
    """A token chosen for a sequence: its raw log-probability, and alternatives when the request asked."""

    token_id: int
    logprob: float
    entry: TokenLogprob | None


@dataclass
class StepResult:
    # Every sampling sequence whose tokens are all computed: one token, or n when its prompt just
    # completed and the request forks into n samples (token i for output i).
    sampled: list[tuple[Sequence, list[Sampled]]] = field(default_factory=list)
    # Every beam request whose beams are all computed: candidate scores (descending), flat indices, and each beam's
    # coverage penalty (None: the request has none).
    beams: list[tuple[SequenceGroup, list[float], list[int], list[float] | None]] = field(default_factory=list)
    # Prompt tokens scored this step (echo / prompt_logprobs), in order.
    prompt_logprobs: list[tuple[Sequence, list[TokenLogprob]]] = field(default_factory=list)


class Transfer:
    """Device tensors queued for the host, copied back together as one float64 vector."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor) -> int:
        self.parts.append(tensor)
        return len(self.parts) - 1

    def start(self) -> "Arrival":
        """Queue the copy; on CUDA it goes into pinned memory without blocking and an event marks its end."""
        if not self.parts:
            return Arrival(None, None, [])
        if len(self.parts) == 1:  # the common step: token ids alone
            flat = self.parts[0].reshape(-1).to(torch.float64, copy=True)
        else:
            flat = torch.cat([p.reshape(-1).to(torch.float64) for p in self.parts])
        event = None
        if flat.device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            flat = host
        return Arrival(flat, event, [p.numel() for p in self.parts])


@dataclass(slots=True)
class Arrival:
    """A started device-to-host copy of a step's results (on the CPU: already there)."""

    flat: torch.Tensor | None
    event: object  # torch.cuda.Event, or None where nothing is in flight
    sizes: list[int]

    def wait(self) -> list[list[float]]:
        if self.flat is None:
            return []
        if self.event is not None:
            self.event.synchronize()
        flat = self.flat.tolist()
        out, start = [], 0
        for size in self.sizes:
            out.append(flat[start : start + size])
            start += size
        return out


@dataclass
class PendingStep:
    """A launched step: its result arrives with `result()`; `sampled_ids` stay on the device for the next step."""

    batch: ScheduledBatch
    sampling: SamplingPlan | None  # whom each row of `sampled_ids` samples for (None: nobody samples)
    sampled_ids: torch.Tensor | None  # (rows,) int64, the tokens chosen for its sequences
    arrival: Arrival
    build: Callable[[list[list[float]]], StepResult]

    def result(self) -> StepResult:
        return self.build(self.arrival.wait())


def read_out(batch: ScheduledBatch, logits: torch.Tensor, logit_rows: LogitRows, masks: PendingMasks | None,
             plan: SamplingPlan | None, banned: torch.Tensor | None = None) -> PendingStep:
    """Queue the step's samples, beam candidates and prompt scores for the host, and start their one copy back.
    `banned`: token ids the checkpoint never lets it say (generation_config.json's one-token bad words)."""
    transfer = Transfer()
    # Beams first: they rank the log-softmax of the whole distribution and ban after it, as transformers and fairseq
    # do; samples and prompt scores then see the banned tokens at -inf
    beams = _rank_beams(logits, logit_rows, transfer, masks, banned)
    if banned is not None:  # in place: a fresh tensor, or the graph's output, which each replay writes anew
        logits.index_fill_(-1, banned, float("-inf"))
    sampled, ids = _sample(logits, plan, transfer)
    scored = _score_prompts(logits, logit_rows, transfer)
    arrival = transfer.start()  # the step's one device-to-host copy
    ids = ids if logit_rows.sampled else None
    return PendingStep(batch, plan, ids, arrival, lambda host: StepResult(sampled(host), beams(host), scored(host)))


def _sample(logits: torch.Tensor, plan: SamplingPlan | None, transfer: Transfer):
    """(how the host reads the samples, the sampled ids on the device)."""
    if plan is None:
        return (lambda host: []), None
    if plan.picked is not None:
        logits = logits.index_select(0, plan.picked)
    elif logits.shape[0] != plan.num_rows:
        logits = logits[: plan.num_rows]
    owners = plan.owners
    # An argmax-only row's log-probability is wrong (its one finite score normalizes to 0), and never read:
    # such a row's request does not score its samples (SamplingParams.needs_only_argmax).
    out = sample(logits, plan.batch)
    ids = transfer.add(out.token_ids)
    lps = None if out.logprobs is None else transfer.add(out.logprobs)
    tops = None
    if out.top_ids is not None:
        tops = (transfer.add(out.top_ids), transfer.add(out.top_logprobs), out.top_ids.shape[1])

    if plan.plain:
        return (lambda host: [(seq, [Sampled(int(token), 0.0, None)]) for (seq, _), token in zip(owners, host[ids])],
                out.token_ids)

    def result(host: list[list[float]]) -> list[tuple[Sequence, list[Sampled]]]:
        token_ids = host[ids]
        logprobs = host[lps] if lps is not None else [0.0] * len(token_ids)
        results, r = [], 0
        for seq, count in owners:
            params = seq.group.params
            want = params.logprobs
            # A request that does not score its samples takes 0.0 even when a row beside it made the sampler
            # score every row: its cumulative_logprob must not depend on what shared its steps.
            scores = params.scores_samples
            chosen = []
            for _ in range(count):
                token, lp = int(token_ids[r]), logprobs[r] if scores else 0.0
                entry = None
                if want is not None:
                    top = []
                    if tops is not None and want:
                        top_ids, top_lps, width = host[tops[0]], host[tops[1]], tops[2]
                        base = r * width
                        top = [(int(top_ids[base + j]), top_lps[base + j]) for j in range(min(want, width))]
                    entry = TokenLogprob(token, lp, top)
                chosen.append(Sampled(token, lp, entry))
                r += 1
            results.append((seq, chosen))
        return results

    return result, out.token_ids


def _rank_beams(logits: torch.Tensor, logit_rows: LogitRows, transfer: Transfer, masks: PendingMasks | None,
                banned: torch.Tensor | None):
    requests, groups = [], []
    for group, rows_of in logit_rows.beam_rows.items():
        if len(rows_of) != len(group.seqs):
            raise RuntimeError(f"beam request {group.request_id}: only some beams were computed this step")
        beam = group.beam
        requests.append(BeamRequest(
            rows=[rows_of[s] for s in group.seqs], scores=list(beam.scores), num_candidates=beam.num_candidates,
            banned=beam.banned_next(group.seqs[0].num_output_tokens),
        ))
        groups.append(group)
    if not requests:
        return lambda host: []
    allowed = None if masks is None else masks.allowed([seq for group in groups for seq in group.seqs])
    penalties = [_coverage_penalties(group) for group in groups]
    values, indices = beam_candidates(logits, requests, allowed, banned, _stepwise_shift(groups, penalties))
    v, i, width = transfer.add(values), transfer.add(indices), values.shape[1]
    penalties = [None if p is None else transfer.add(p) for p in penalties]

    def result(host: list[list[float]]):
        out = []
        for g, (group, request, p) in enumerate(zip(groups, requests, penalties)):
            first, k = g * width, min(request.num_candidates, width)
            out.append((group, host[v][first : first + k], [int(x) for x in host[i][first : first + k]],
                        None if p is None else host[p]))
        return out

    return result


def add_coverage(work: list[tuple[Sequence, int]], alignment: torch.Tensor) -> None:
    """Add the step's alignment (StepBatch.alignment, a row per sequence of `work`) to the coverage of each sequence
    that sums it; a chunk from position 0 (a first step, or one recomputed after preemption) starts it anew."""
    for row, (seq, _) in enumerate(work):
        if seq.group.params.follows_coverage:
            step = alignment[row, : len(seq.group.encoder_token_ids)]
            seq.coverage = step if seq.num_computed == 0 or seq.coverage is None else seq.coverage + step


def _coverage_penalties(group: SequenceGroup) -> torch.Tensor | None:
    """(W,) each beam's coverage penalty, this step's attention included; None where the request has none."""
    params = group.params
    if not params.follows_coverage:
        return None
    coverage = torch.stack([seq.coverage for seq in group.seqs])
    return coverage_penalty(coverage, params.coverage_penalty, params.coverage_penalty_type)


def _stepwise_shift(groups: list[SequenceGroup], penalties: list[torch.Tensor | None]) -> torch.Tensor | None:
    """(beams of all groups,) what each beam's score loses before the step's candidates are ranked: its penalty
    where its request ranks with it (stepwise), else 0; None where no request does."""
    stepwise = [group.params.coverage_penalty_stepwise for group in groups]
    if not any(stepwise):
        return None
    device = next(p.device for p, ranks in zip(penalties, stepwise) if ranks)
    return torch.cat([-p if ranks else torch.zeros(len(group.seqs), device=device)
                      for group, p, ranks in zip(groups, penalties, stepwise)])


def _score_prompts(logits: torch.Tensor, logit_rows: LogitRows, transfer: Transfer):
    if not logit_rows.scored:
        return lambda host: []
    queued = []
    for seq, first_row, first_pos, count in logit_rows.scored:
        scored = prompt_logprobs(logits[first_row : first_row + count],
                                 seq.token_ids[first_pos : first_pos + count + 1], seq.group.params.prompt_logprobs)
        top = None
        if scored.top_ids is not None:
            top = (transfer.add(scored.top_ids), transfer.add(scored.top_logprobs), scored.top_ids.shape[1])
        queued.append((seq, first_pos, count, transfer.add(scored.logprobs), top))

    def result(host: list[list[float]]):
        out = []
        for seq, first_pos, count, chosen, top in queued:
            entries = []
            for j in range(count):
                alternatives = []
                if top is not None:
                    ids, values, width = host[top[0]], host[top[1]], top[2]
                    alternatives = [(int(ids[j * width + c]), values[j * width + c]) for c in range(width)]
                entries.append(TokenLogprob(seq.token_ids[first_pos + 1 + j], host[chosen][j], alternatives))
            out.append((seq, entries))
        return out

    return result
