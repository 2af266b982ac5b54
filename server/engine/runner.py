"""The only part of the engine that touches tensors: one scheduled batch in, its tokens out.

A step (1) applies the cache managers' device work (block copies, slot copies and resets),
(2) packs the scheduled tokens into persistent, max-sized input buffers (one host-to-device copy
per field), (3) runs the model, (4) on the device: samples a token for every sequence whose
tokens are now all computed, ranks the candidates of every beam request with one top-k, and
scores prompt tokens for requests that asked, and (5) brings everything the host needs back in
a single device-to-host copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.batch import StepBatch
from models.checkpoint import LoadedModel
from server.sampling import prompt_logprobs, sample
from server.sampling.beam import BeamRequest, beam_candidates
from server.sampling.table import SamplingTable

from .cache import CacheOp
from .outputs import TokenLogprob
from .scheduler import ScheduledBatch
from .sequence import Sequence, SequenceGroup


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
    # Every beam request whose beams are all computed: candidate scores (descending), flat indices.
    beams: list[tuple[SequenceGroup, list[float], list[int]]] = field(default_factory=list)
    # Prompt tokens scored this step (echo / prompt_logprobs), in order.
    prompt_logprobs: list[tuple[Sequence, list[TokenLogprob]]] = field(default_factory=list)


def apply_cache_ops(state, ops: list[CacheOp]) -> None:
    """Carry out a cache manager's device work, in order, on a `PagedKVCache` or `SlotState`."""
    for op in ops:
        if op.kind == "reset":
            state.reset(list(op.dst))
        elif state.kind == "paged_kv":
            state.copy_blocks(list(op.src), list(op.dst))
        else:
            state.copy(list(op.src), list(op.dst))


class _Transfer:
    """Device tensors queued for the host, copied back together as one float64 vector."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor) -> int:
        self.parts.append(tensor)
        return len(self.parts) - 1

    def fetch(self) -> list[list[float]]:
        if not self.parts:
            return []
        flat = torch.cat([p.reshape(-1).to(torch.float64) for p in self.parts]).cpu().tolist()
        out, start = [], 0
        for p in self.parts:
            out.append(flat[start : start + p.numel()])
            start += p.numel()
        return out


class ModelRunner:
    def __init__(self, loaded: LoadedModel, state, cache, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int | None):
        self.loaded = loaded
        self.model = loaded.model
        self.state = state
        self.cache = cache  # to read block tables / slots
        self.paged = self.model.state_kind == "paged_kv"
        self.device = device = loaded.device
        self.vocab_size = self.model.config.vocab_size
        self.sampling = SamplingTable(max_num_seqs, self.vocab_size, device)
        max_tokens = max_num_batched_tokens  # the scheduler never packs more into a step
        self.token_ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.logits_indices = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.slots = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        self.sample_slots = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        self.block_tables = None
        if self.paged:
            max_blocks = -(-(max_model_len or 4096) // cache.block_size)
            self.block_tables = torch.zeros(max_num_seqs * max_blocks, dtype=torch.long, device=device)

    # ---- the step ------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        apply_cache_ops(self.state, batch.cache_ops)
        if batch.admitted:
            self.sampling.write([g.slot for g in batch.admitted], [g.params for g in batch.admitted])
        step, plan = self._prepare(batch.work)
        logits = self.model.step(step, self.state)  # (rows of plan, V)
        return self._finish(logits, plan)


    @staticmethod
    def _upload(buffer: torch.Tensor, values: list[int]) -> torch.Tensor:
        """One host-to-device copy into the front of a persistent buffer; returns that view."""
        view = buffer[: len(values)]
        view.copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
        return view

    def _prepare(self, work: list[tuple[Sequence, int]]) -> tuple[StepBatch, "_Plan"]:
        plan = _Plan()
        tokens: list[int] = []
        positions: list[int] = []
        rows: list[int] = []  # packed token index of each logits row
        where = []
        locate = self.cache.block_table if self.paged else self.cache.slot
        offset = 0
        for seq, n in work:
            start = seq.num_computed
            token_ids = seq.token_ids
            if n == 1:
                tokens.append(token_ids[start])
                positions.append(start)
            else:
                tokens += token_ids[start : start + n]
                positions += range(start, start + n)
            where.append(locate(seq.seq_id))
            group = seq.group
            completes = start + n == len(token_ids)
            if group.params.prompt_logprobs is not None and not group.is_forked:
                count = min(n, seq.num_prompt_tokens - 1 - start)  # rows predicting prompt tokens
                if count > 0:
                    plan.scored.append((seq, len(rows), start, count))
                rows.extend(range(offset, offset + n))
                last_row = len(rows) - 1
            elif completes:
                last_row = len(rows)
                rows.append(offset + n - 1)
            if completes:
                if group.params.use_beam_search:
                    plan.beam_rows.setdefault(group, {})[seq] = last_row
                else:
                    plan.sampled.append((seq, last_row))
            offset += n
        query_lens = [n for _, n in work]
        step = StepBatch(
            token_ids=self._upload(self.token_ids, tokens),
            positions=self._upload(self.positions, positions),
            query_lens=query_lens,
            logits_indices=self._upload(self.logits_indices, rows),
        )
        if self.paged:
            width = max(map(len, where))
            flat, padding = [], [0] * width
            for table in where:  # each sequence's blocks, padded to the widest table of the step
                flat += table
                if len(table) < width:
                    flat += padding[: width - len(table)]
            step.block_tables = self._upload(self.block_tables, flat).view(len(where), width)
        else:
            step.slots = self._upload(self.slots, where)
        return step, plan

    def _finish(self, logits: torch.Tensor, plan: "_Plan") -> StepResult:
        transfer = _Transfer()
        sampled = self._sample(logits, plan, transfer)
        beams = self._rank_beams(logits, plan, transfer)
        scored = self._score_prompts(logits, plan, transfer)
        host = transfer.fetch()  # the step's one device-to-host copy
        return StepResult(sampled(host), beams(host), scored(host))

    # ---- sampling ------------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor, plan: "_Plan", transfer: _Transfer):
        rows, slots, params, generators, owners = [], [], [], [], []
        needs_tokens = False
        for seq, row in plan.sampled:
            group = seq.group
            p = group.params
            # A prompt that just completed samples the first token of each of its n outputs.
            indices = range(p.n) if not group.is_forked else (seq.index,)
            for i in indices:
                rows.append(row)
                slots.append(group.slot)
                params.append(p)
                generators.append(group.generators[i] if group.generators else None)
            owners.append((seq, len(indices)))
            needs_tokens = needs_tokens or p.has_penalties or p.min_tokens > 0
        if not rows:
            return lambda host: []
        prompt_ids = output_ids = None
        if needs_tokens:
            expanded = [seq for seq, count in owners for _ in range(count)]
            prompt_ids = [s.token_ids[: s.num_prompt_tokens] for s in expanded]
            output_ids = [s.output_token_ids for s in expanded]
        sbatch = self.sampling.gather(
            self._upload(self.sample_slots, slots), params, generators, prompt_ids, output_ids,
            self.loaded.eos_token_ids,
        )
        if len(rows) != logits.shape[0] or rows != list(range(len(rows))):  # not simply every row in order
            logits = logits.index_select(0, torch.tensor(rows, device=logits.device))
        out = sample(logits, sbatch)
        ids = transfer.add(out.token_ids)
        lps = None if out.logprobs is None else transfer.add(out.logprobs)
        tops = None
        if out.top_ids is not None:
            tops = (transfer.add(out.top_ids), transfer.add(out.top_logprobs), out.top_ids.shape[1])

        def result(host: list[list[float]]) -> list[tuple[Sequence, list[Sampled]]]:
            token_ids = host[ids]
            logprobs = host[lps] if lps is not None else [0.0] * len(token_ids)
            results, r = [], 0
            for seq, count in owners:
                want = seq.group.params.logprobs
                chosen = []
                for _ in range(count):
                    token, lp = int(token_ids[r]), logprobs[r]
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

        return result

    def _rank_beams(self, logits: torch.Tensor, plan: "_Plan", transfer: _Transfer):
        requests, groups = [], []
        for group, rows_of in plan.beam_rows.items():
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
        values, indices = beam_candidates(logits, requests)
        v, i, width = transfer.add(values), transfer.add(indices), values.shape[1]

        def result(host: list[list[float]]):
            out = []
            for g, (group, request) in enumerate(zip(groups, requests)):
                k = min(request.num_candidates, width)
                out.append((group, host[v][g * width : g * width + k], [int(x) for x in host[i][g * width : g * width + k]]))
            return out

        return result

    def _score_prompts(self, logits: torch.Tensor, plan: "_Plan", transfer: _Transfer):
        if not plan.scored:
            return lambda host: []
        queued = []
        for seq, first_row, first_pos, count in plan.scored:
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


@dataclass
class _Plan:
    """Which logits rows of the step serve what."""

    sampled: list[tuple[Sequence, int]] = field(default_factory=list)  # sequence, its next-token row
    beam_rows: dict[SequenceGroup, dict[Sequence, int]] = field(default_factory=dict)
    scored: list[tuple[Sequence, int, int, int]] = field(default_factory=list)  # seq, first row, first pos, count
