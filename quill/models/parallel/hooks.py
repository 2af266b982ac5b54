"""What a sharded Transformer's step does differently from a whole one: three hooks, called only when it is sharded.

- `reduce`: the attention's and the MLP's outputs are partial sums (row-parallel layers): sum them over the ranks.
- `embed`: each rank looks up the tokens its vocabulary rows hold, zeros for the others; the sum is the lookup.
- `logits`: each rank scores its vocabulary rows; rank 0 joins them (the others get None: only rank 0 samples).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .collectives import Collectives


class TensorParallel:
    def __init__(self, group: Collectives, vocab_start: int, vocab_shard: int, vocab_size: int):
        self.group = group
        self.vocab_start = vocab_start
        self.vocab_shard = vocab_shard  # rows each rank holds
        self.vocab_size = vocab_size  # the whole vocabulary's

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(x)

    def embed(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (T,) -> (T, D) rows of the whole embedding, from this rank's rows `table` (vocab_shard, D)."""
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_shard)
        x = F.embedding(local.masked_fill(outside, 0), table)
        return self.reduce(x.masked_fill(outside[:, None], 0))

    def logits(self, local: torch.Tensor) -> torch.Tensor | None:
        """(rows, vocab_shard) scores of this rank's rows -> (rows, V) on rank 0, None elsewhere."""
        shards = self.group.gather(local)
        if shards is None:
            return None
        return torch.cat(shards, dim=-1)[:, : self.vocab_size]
