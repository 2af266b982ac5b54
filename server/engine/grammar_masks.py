"""The token masks of a step's constrained sequences, filled on the host while the device runs the forward pass.

`start` is called before the model step is launched and hands the fill to a thread of its own (llguidance
releases the interpreter lock and spreads the rows over its own threads), so the masks are computed while
the forward pass runs (on CUDA the host is free once it has queued the kernels; on the CPU the two share the
cores). The sampler waits for them only when it needs them. A step with no constrained sequence does nothing
here. Each distinct sequence gets one mask row; a prompt that forks into n samples uses its row n times.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch
from llguidance import LLExecutor

from server.structured.matcher import bitmask_words, fill_bitmasks

from .sequence import Sequence


class PendingMasks:
    """Masks being filled for some sequences: `row_of[seq]` is a sequence's row of `bitmask()`."""

    def __init__(self, row_of: dict[Sequence, int], host: torch.Tensor, filled: Future, device: torch.device):
        self.row_of = row_of
        self._host = host
        self._filled = filled
        self._device = device
        self._on_device: torch.Tensor | None = None

    def bitmask(self) -> torch.Tensor:
        """(C, words) int32 on the device, once the fill is done."""
        if self._on_device is None:
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
            bitmask = bitmask.index_select(0, torch.tensor(mask_rows, device=bitmask.device))
        return torch.tensor(rows, device=bitmask.device), bitmask


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device):
        self.words = bitmask_words(vocab_size)
        self.device = device
        self._executor: LLExecutor | None = None  # llguidance's threads, made when a grammar is first used
        self._thread: ThreadPoolExecutor | None = None

    def start(self, seqs: list[Sequence]) -> PendingMasks | None:
        """Begin filling the masks of those of `seqs` that have a grammar; None when none has."""
        constrained = list(dict.fromkeys(seq for seq in seqs if seq.grammar is not None))
        if not constrained:
            return None
        if self._thread is None:
            self._executor = LLExecutor()
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="quill-masks")
        host = torch.empty(len(constrained), self.words, dtype=torch.int32,
                           pin_memory=self.device.type == "cuda")
        matchers = [seq.grammar for seq in constrained]
        filled = self._thread.submit(fill_bitmasks, self._executor, matchers, host)
        return PendingMasks({seq: i for i, seq in enumerate(constrained)}, host, filled, self.device)
