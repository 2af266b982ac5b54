"""Every running request's sampling settings, kept on the device between steps.

One row per request slot in a persistent (num_slots, 7) float64 tensor, written once when a
request starts running (one host-to-device copy for all requests admitted in a step). A step
gathers its rows by slot, so building the sampler's per-row tensors costs a handful of device
ops whatever the batch size, instead of one Python pass and one copy per setting per step.
Only what is rare and changes every step (penalty counts, min_tokens bans, logit bias) is built
from the token lists, and only for steps where some row uses it. `build_batch` makes one batch
outside an engine, through a table of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from quill.models.host_copy import to_device

from .batch import SamplingBatch
from .params import SamplingParams
from .processors import token_counts

COLUMNS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def settings_row(p: SamplingParams) -> list[float]:
    """A request's row; greedy rows turn every filter off (they take the argmax of the penalized logits)."""
    greedy = p.is_greedy
    return [
        0.0 if greedy else p.temperature,
        0.0 if greedy or p.top_k < 0 else float(p.top_k),
        1.0 if greedy else p.top_p,
        0.0 if greedy else p.min_p,
        p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
    ]


class SamplingTable:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device | str):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.settings = torch.zeros(num_slots, len(COLUMNS), dtype=torch.float64, device=self.device)
        self._greedy: SamplingBatch | None = None  # every setting of a greedy row without penalties, num_slots rows
        self._greedy_cuts: dict[tuple, SamplingBatch] = {}  # its first rows, by (rows, logprob outputs)

    def write(self, slots: list[int], params: list[SamplingParams]) -> None:
        """Requests starting to run: slot i takes params[i]'s settings."""
        if not slots:
            return
        rows = to_device([value for p in params for value in settings_row(p)], self.device, torch.float64)
        self.settings.index_copy_(0, to_device(slots, self.device, torch.long), rows.view(len(slots), len(COLUMNS)))

    def gather(
        self,
        slots: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        prompt_ids: Sequence[list[int]] | None = None,
        output_ids: Sequence[list[int]] | None = None,
        eos_token_ids: Sequence[int] = (),
        allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SamplingBatch:
        """The sampler's batch for rows whose requests sit in `slots` (B,) on the device.

        params[i] and generators[i] belong to row i (flags and seeded rows are decided on the host); prompt_ids /
        output_ids are needed only when some row has penalties or an active min_tokens.
        """
        columns = self.settings.index_select(0, slots).unbind(1)
        by_name = dict(zip(COLUMNS, columns))
        flags = RowFlags.of(params, self.vocab_size)
        needs_repetition = any(p.repetition_penalty != 1.0 for p in params)
        needs_counts = any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params)
        output_counts = seen_tokens = banned = None
        if needs_repetition or needs_counts:
            output_counts = token_counts(list(output_ids), self.vocab_size, self.device)
            if needs_repetition:
                seen_tokens = (token_counts(list(prompt_ids), self.vocab_size, self.device) + output_counts) > 0
        if any(p.min_tokens for p in params):
            banned = flat_banned_tokens(params, output_ids, eos_token_ids, self.vocab_size, self.device)
        temperature = by_name["temperature"].float()
        return SamplingBatch(
            temperature=temperature,
            is_greedy=temperature == 0,
            top_k=by_name["top_k"].long(),
            top_p=by_name["top_p"],
            min_p=by_name["min_p"].float(),
            repetition_penalty=by_name["repetition_penalty"].float(),
            presence_penalty=by_name["presence_penalty"].float(),
            frequency_penalty=by_name["frequency_penalty"].float(),
            seen_tokens=seen_tokens,
            output_counts=output_counts if needs_counts else None,
            bias=flat_logit_bias(params, self.vocab_size, self.device) if any(p.logit_bias for p in params) else None,
            banned=banned,
            allowed=allowed,
            # a greedy row's generator is never drawn from (its argmax wins): only random rows are seeded
            seeded_rows=[(row, gen) for row, (gen, p) in enumerate(zip(generators, params))
                         if gen is not None and not p.is_greedy],
            max_top_k=flags.max_top_k,
            uses_top_p=flags.uses_top_p,
            uses_min_p=flags.uses_min_p,
            all_greedy=flags.all_greedy,
            any_greedy=flags.any_greedy,
            num_top_logprobs=flags.num_top_logprobs,
            needs_logprobs=flags.needs_logprobs,
        )


    def gather_plain(self, slots: torch.Tensor, flags: RowFlags,
                     seeded_rows: list[tuple[int, torch.Generator]]) -> SamplingBatch:
        """`gather` for rows known to need no token lists, logit bias or grammar (no penalties, min_tokens, bias
        or mask): the settings gathered on the device, `flags` and `seeded_rows` decided by the caller. Rows that
        are all greedy have all the same settings, which need no gathering."""
        if flags.all_greedy:
            return self._greedy_rows(slots.shape[0], flags)
        columns = self.settings.index_select(0, slots).unbind(1)
        by_name = dict(zip(COLUMNS, columns))
        temperature = by_name["temperature"].float()
        return SamplingBatch(
            temperature=temperature, is_greedy=temperature == 0, top_k=by_name["top_k"].long(),
            top_p=by_name["top_p"], min_p=by_name["min_p"].float(),
            repetition_penalty=by_name["repetition_penalty"].float(),
            presence_penalty=by_name["presence_penalty"].float(),
            frequency_penalty=by_name["frequency_penalty"].float(),
            seen_tokens=None, output_counts=None, bias=None, banned=None, allowed=None, seeded_rows=seeded_rows,
            max_top_k=flags.max_top_k, uses_top_p=flags.uses_top_p, uses_min_p=flags.uses_min_p,
            all_greedy=flags.all_greedy, any_greedy=flags.any_greedy, num_top_logprobs=flags.num_top_logprobs,
            needs_logprobs=flags.needs_logprobs,
        )


    def _greedy_rows(self, num_rows: int, flags: "RowFlags") -> SamplingBatch:
        """`num_rows` greedy rows without penalties: views of one batch of such rows, made once."""
        if self._greedy is None:
            row = torch.tensor(settings_row(SamplingParams(temperature=0.0)), dtype=torch.float64, device=self.device)
            columns = dict(zip(COLUMNS, row.expand(self.settings.shape[0], -1).contiguous().unbind(1)))
            temperature = columns["temperature"].float()
            self._greedy = SamplingBatch(
                temperature=temperature, is_greedy=temperature == 0, top_k=columns["top_k"].long(),
                top_p=columns["top_p"], min_p=columns["min_p"].float(),
                repetition_penalty=columns["repetition_penalty"].float(),
                presence_penalty=columns["presence_penalty"].float(),
                frequency_penalty=columns["frequency_penalty"].float(), seen_tokens=None, output_counts=None,
                bias=None, banned=None, allowed=None, seeded_rows=[], max_top_k=0, uses_top_p=False,
                uses_min_p=False, all_greedy=True, any_greedy=True, num_top_logprobs=0, needs_logprobs=False)
        key = (num_rows, flags.num_top_logprobs, flags.needs_logprobs)
        cut = self._greedy_cuts.get(key)
        if cut is None:
            g = self._greedy
            cut = self._greedy_cuts[key] = replace(
                g, temperature=g.temperature[:num_rows], is_greedy=g.is_greedy[:num_rows],
                top_k=g.top_k[:num_rows], top_p=g.top_p[:num_rows], min_p=g.min_p[:num_rows],
                repetition_penalty=g.repetition_penalty[:num_rows], presence_penalty=g.presence_penalty[:num_rows],
                frequency_penalty=g.frequency_penalty[:num_rows], num_top_logprobs=flags.num_top_logprobs,
                needs_logprobs=flags.needs_logprobs)
        return cut


@dataclass(frozen=True, slots=True)
class RowFlags:
    """What the host decides about a batch's rows from their settings alone: which filters and outputs the sampler
    needs at all (each off unless some row uses it). Flags of more rows than a batch has (rows that left since)
    still serve it: a filter on for a row whose own setting turns it off changes nothing."""

    max_top_k: int  # largest active top_k; 0 = no row uses top-k
    uses_top_p: bool
    uses_min_p: bool
    all_greedy: bool
    any_greedy: bool
    num_top_logprobs: int  # largest `logprobs` asked for; 0 = none
    needs_logprobs: bool  # some row scores its samples

    @staticmethod
    def of(params: Sequence[SamplingParams], vocab_size: int) -> "RowFlags":
        sampled = [p for p in params if not p.is_greedy]
        return RowFlags(
            max_top_k=max((p.top_k for p in sampled if 0 < p.top_k < vocab_size), default=0),
            uses_top_p=any(p.top_p < 1.0 for p in sampled),
            uses_min_p=any(p.min_p > 0.0 for p in sampled),
            all_greedy=not sampled,
            any_greedy=len(sampled) < len(params),
            num_top_logprobs=max((p.logprobs or 0 for p in params), default=0),
            needs_logprobs=any(p.scores_samples for p in params),
        )

    def join(self, other: "RowFlags") -> "RowFlags":
        """The flags of both sets of rows together."""
        return RowFlags(
            max_top_k=max(self.max_top_k, other.max_top_k), uses_top_p=self.uses_top_p or other.uses_top_p,
            uses_min_p=self.uses_min_p or other.uses_min_p, all_greedy=self.all_greedy and other.all_greedy,
            any_greedy=self.any_greedy or other.any_greedy,
            num_top_logprobs=max(self.num_top_logprobs, other.num_top_logprobs),
            needs_logprobs=self.needs_logprobs or other.needs_logprobs,
        )


def build_batch(
    params: Sequence[SamplingParams],
    prompt_ids: Sequence[list[int]],
    output_ids: Sequence[list[int]],
    generators: Sequence[torch.Generator | None],
    vocab_size: int,
    device: torch.device | str,
    eos_token_ids: Sequence[int] = (),
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> SamplingBatch:
    """A batch on its own, through a table of its own (the engine gathers its batches from one table).

    Row i samples the next token of a sequence with settings params[i], prompt prompt_ids[i]
    and generated tokens output_ids[i]. generators[i] is used (and advanced) when the row is
    random and it is not None: the engine makes one per seeded request with `new_generator`
    and keeps it across steps. eos_token_ids are banned, with stop_token_ids, until min_tokens.
    allowed: the rows under a grammar and their token masks (see SamplingBatch.allowed).
    """
    num_rows = len(params)
    if not num_rows == len(prompt_ids) == len(output_ids) == len(generators):
        raise ValueError(
            f"one entry per row expected: {num_rows} params, {len(prompt_ids)} prompts, "
            f"{len(output_ids)} outputs, {len(generators)} generators"
        )
    table = SamplingTable(max(num_rows, 1), vocab_size, device)
    table.write(list(range(num_rows)), list(params))
    slots = torch.arange(num_rows, device=device)
    batch = table.gather(slots, params, generators, prompt_ids, output_ids, eos_token_ids, allowed)
    return replace(batch, needs_logprobs=True)  # built on its own, a batch reports every row's log-probability


def flat_logit_bias(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    # Ids past the vocabulary are skipped here; SamplingParams.check_vocab rejects them at admission.
    entries = [
        (row, token_id, value)
        for row, p in enumerate(params)
        for token_id, value in (p.logit_bias or {}).items()
        if token_id < vocab_size
    ]
    if not entries:
        return None
    rows, token_ids, values = zip(*entries)
    return (
        to_device(rows, device, torch.long),
        to_device(token_ids, device, torch.long),
        to_device(values, device, torch.float32),
    )


def flat_banned_tokens(
    params: Sequence[SamplingParams],
    output_ids: Sequence[list[int]],
    eos_token_ids: Sequence[int],
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    # A row may not end (EOS or a stop id) until it has min_tokens generated tokens.
    entries = [
        (row, token_id)
        for row, (p, out) in enumerate(zip(params, output_ids))
        if len(out) < p.min_tokens
        for token_id in p.all_stop_token_ids(eos_token_ids)
        if token_id < vocab_size
    ]
    if not entries:
        return None
    rows, token_ids = zip(*entries)
    return (
        to_device(rows, device, torch.long),
        to_device(token_ids, device, torch.long),
    )
