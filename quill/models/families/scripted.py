"""A model with no compute: logits looked up from a fixed table, for testing and timing the engine.

It honours the model contract (`state_kind`, `new_state`, `step`) with either kind of state, so
the scheduler, cache managers, runner, sampler and output processing run exactly as they do for a
real model, while the "forward pass" is one row lookup: the next-token logits depend only on the
last token (`table[token]`), plus an optional `logits_fn` that rewrites them (tests choose logits
this way). Timing a step of this model measures the engine's own host overhead.

Registered as architecture "scripted", so a checkpoint directory of it (config.json, the table as
the one weight, a tokenizer) is served like any model: benchmarks measure the server's overhead
at the speed of a GPU's step with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..batch import StepBatch
from ..state import HybridState, PagedKVCache, SlotState


@dataclass
class ScriptedConfig:
    vocab_size: int
    max_seq_len: int = 4096
    state_kind: str = "paged_kv"  # or "slots", or "hybrid" (both)


class ScriptedModel(nn.Module):
    def __init__(self, config: ScriptedConfig, seed: int = 0,
                 logits_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        super().__init__()
        self.config = config
        self.state_kind = config.state_kind
        # A parameter (frozen), not a buffer: a checkpoint's weights file carries it.
        self.table = nn.Parameter(torch.empty(config.vocab_size, config.vocab_size), requires_grad=False)
        if self.table.device.type != "meta":  # the loader builds on the meta device, then assigns the weights
            generator = torch.Generator().manual_seed(seed)
            self.table.copy_(torch.randn(config.vocab_size, config.vocab_size, generator=generator))
        self.logits_fn = logits_fn  # (last tokens (K,), positions (K,)) -> (K, V) logits, replaces the table

    def new_state(self, num: int, num_slots: int | None = None, block_size: int = 16,
                  dtype: torch.dtype | None = None):
        """`num` blocks (paged_kv, hybrid) or slots; a hybrid's `num_slots` slots beside its blocks."""
        device = self.table.device
        if self.state_kind == "slots":
            return SlotState({"last": torch.zeros(num, 1, device=device)})
        kv = PagedKVCache(1, num, block_size, 1, 1, dtype or torch.float32, device)
        if self.state_kind == "hybrid":
            return HybridState(kv, SlotState({"last": torch.zeros(num_slots, 1, device=device)}))
        return kv

    @torch.inference_mode()
    def step(self, batch: StepBatch, state) -> torch.Tensor:
        rows = batch.logits_indices
        if rows is None:
            rows = torch.arange(batch.num_tokens, device=batch.token_ids.device)
        tokens, positions = batch.token_ids[rows], batch.positions[rows]
        if self.logits_fn is not None:
            return self.logits_fn(tokens, positions).float()
        return self.table.index_select(0, tokens)
