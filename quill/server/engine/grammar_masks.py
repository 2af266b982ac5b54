"""The token masks of a step's constrained sequences, filled on the host before or while the forward pass runs.

`start` is called before the model step is launched. On a GPU it hands the fill to a thread of its own
(llguidance releases the interpreter lock and spreads the rows over its own threads), so the masks are
computed while the device runs the forward pass the host has queued. On the CPU the forward pass is the host's
own work on every core: a fill beside it oversubscribed the cores and slowed the forward pass 3-4x (2-core
EPYC, 64 constrained rows, benchmarks/structured_bench.py), so there the masks are filled first, in line
(about 10 us per row). The sampler waits for them only when it needs them. A step with no constrained sequence
does nothing here. Each distinct sequence gets one mask row; a prompt that forks into n samples uses it n times.
A request's `no_repeat_ngram_size` and bad-word bans go into the same masks (computed in line on the host: a few
tokens each).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch
from llguidance import LLExecutor

from quill.models.host_copy import to_device

from quill.server.sampling.ngrams import banned_by_bad_words, banned_by_ngrams, clear_bits
from quill.server.structured.matcher import bitmask_words, fill_bitmasks

from .sequence import Sequence


class PendingMasks:
    """Masks being filled for some sequences: `row_of[seq]` is a sequence's row of `bitmask()`."""

    def __init__(self, row_of: dict[Sequence, int], host: torch.Tensor, filled: Future | None, device: torch.device):
        self.row_of = row_of
        self._host = host
        self._filled = filled  # None: filled already
        self._device = device
        self._on_device: torch.Tensor | None = None

    def bitmask(self) -> torch.Tensor:
        """(C, words) int32 on the device, once the fill is done."""
        if self._on_device is None:
            if self._filled is not None:
                self._filled.result()
            self._on_device = self._host.to(self._device, non_blocking=True)
        return self._on_device

    def allowed(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The sampler's (rows, masks) for a list of rows whose i-th row samples for seqs[i]; None if none is
        constrained. Rows come out ascending, as `apply_allowed_tokens` expects."""
        rows = [i for i, seq in enumerate(seqs) if seq in self.row_of]
        if not rows:
            return None
        mask_rows = [self.row_of[seqs[i]] for i in rows]
        bitmask = self.bitmask()
        if mask_rows != list(range(bitmask.shape[0])):
            bitmask = bitmask.index_select(0, to_device(mask_rows, bitmask.device, torch.long))
        return to_device(rows, bitmask.device, torch.long), bitmask


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device):
        self.words = bitmask_words(vocab_size)
        self.device = device
        self.overlaps = device.type != "cpu"  # see the module's docstring
        self._executor: LLExecutor | None = None  # llguidance's threads and ours, made when a grammar is first used
        self._thread: ThreadPoolExecutor | None = None

    def start(self, seqs: list[Sequence]) -> PendingMasks | None:
        """Begin filling the masks of those of `seqs` that have a grammar or bans by history; None when none has."""
        bans, constrained = {}, {}  # one pass over the step's sequences: most have neither
        for seq in seqs:
            params = seq.group.params
            banned = None
            if params.bans_by_history:
                size = params.no_repeat_ngram_size
                banned = ((banned_by_ngrams(seq.token_ids, size) if size else [])
                          + banned_by_bad_words(seq.token_ids, params.bad_words_token_ids))
            if banned:
                bans[seq] = banned
            if banned or seq.grammar is not None:
                constrained[seq] = None
        if not constrained:
            return None
        constrained = list(constrained)
        host = torch.empty(len(constrained), self.words, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        row_of = {seq: i for i, seq in enumerate(constrained)}
        if bans:  # grammars and bans in line: a banned bit is cleared after its grammar set it
            for row, seq in enumerate(constrained):
                if seq.grammar is not None:
                    seq.grammar.fill(host, row)
                else:
                    host[row] = -1  # every token allowed
                clear_bits(host, row, bans.get(seq, ()))
            return PendingMasks(row_of, host, None, self.device)
        matchers = [seq.grammar for seq in constrained]
        if not self.overlaps:
            for row, matcher in enumerate(matchers):
                matcher.fill(host, row)
            return PendingMasks(row_of, host, None, self.device)
        if self._thread is None:
            self._executor = LLExecutor()
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="quill-masks")
        return PendingMasks(row_of, host, self._thread.submit(fill_bitmasks, self._executor, matchers, host),
                            self.device)
