"""Rank 0's face of a tensor-parallel model: the engine steps it exactly as it would the whole model.

`ParallelModel.step` sends the step's input to the other ranks, then runs rank 0's shard, whose collectives the
others join; it returns the whole vocabulary's logits, gathered from every rank's shard. Its states are rank 0's
K,V caches (its K,V heads, every block); each other rank keeps a cache of the same blocks for its heads, made,
copied and dropped as rank 0's are: `new_state`, the cache managers' block copies (`MirroredKVCache`) and a state
garbage-collected are queued and travel with the next step, before it, so every rank's blocks hold what the same
block tables point at. A step that fails leaves the ranks out of step: the group is lost, as a device is
(faults.py), and the engine stops.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections import deque

import torch
from torch import nn

from quill.models.attention import select_attention_backend
from quill.models.batch import StepBatch
from quill.models.families.transformer import TransformerConfig, TransformerLanguageModel
from quill.models.state import PagedKVCache

from ..faults import DeviceLostError
from .ranks import Ranks
from .step_message import pack

log = logging.getLogger("quill.engine")


class MirroredKVCache(PagedKVCache):
    """Rank 0's K,V blocks; each copy is queued for the other ranks' caches of the same blocks."""

    def __init__(self, state_id: int, queue: deque, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state_id = state_id
        self.queue = queue

    def copy_blocks(self, src, dst) -> None:
        super().copy_blocks(src, dst)
        self.queue.append(["copy", self.state_id, [int(b) for b in src], [int(b) for b in dst]])


class ParallelModel(nn.Module):
    """Rank 0's model of a tensor-parallel group (the module's docstring says how it steps)."""

    state_kind = PagedKVCache.kind

    def __init__(self, shard: TransformerLanguageModel, config: TransformerConfig, ranks: Ranks):
        """`shard`: rank 0's model, its collectives attached; `config`: the whole model's (the engine reads its
        vocabulary and context from it)."""
        super().__init__()
        self.shard = shard
        self.config = config
        self.ranks = ranks
        # State operations for the other ranks, sent with the next step (a deque: a finalizer may append on any thread)
        self._queue: deque = deque()
        self._state_ids = itertools.count()
        self.lost: str | None = None

    @property
    def attention_backend(self) -> str:
        return self.shard.attention_backend

    @property
    def size(self) -> int:
        return self.ranks.size

    def new_state(self, num_blocks: int, block_size: int = 16, dtype: torch.dtype | None = None,
                  attention_backend: str | None = None) -> MirroredKVCache:
        """Rank 0's cache (its K,V heads); every other rank makes its own of the same blocks before the next step."""
        c, like = self.shard.config, self.shard.embed.weight
        backend = select_attention_backend(attention_backend or self.shard.attention_backend, like.device)
        dtype = dtype or like.dtype
        state_id = next(self._state_ids)
        state = MirroredKVCache(state_id, self._queue, c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim,
                                dtype, like.device, attention=backend)
        self._queue.append(["new", state_id, num_blocks, block_size, str(dtype).removeprefix("torch."), backend.name])
        weakref.finalize(state, self._queue.append, ["drop", state_id])  # (a profiling cache, once the engine drops it)
        return state

    @torch.inference_mode()
    def step(self, batch: StepBatch, state: MirroredKVCache) -> torch.Tensor:
        """The whole vocabulary's logits of the step, every rank having run it on its shard."""
        if self.lost is not None:
            raise DeviceLostError(self.lost)
        try:
            self.ranks.check()
            fields, payload = pack(batch)
            ops = [self._queue.popleft() for _ in range(len(self._queue))]
            self.ranks.channel.send({"ops": ops, "state": state.state_id, "step": fields}, payload)
            return self.shard.step(batch, state)
        except Exception as e:
            self.lost = (f"the tensor-parallel group of {self.size} ranks is lost ({type(e).__name__}: {e}); "
                         "the server must be restarted")
            log.error("%s", self.lost)
            self.ranks.abandon()
            raise DeviceLostError(self.lost) from e

    def close(self) -> None:
        """Stop the other ranks (they exit)."""
        self.ranks.stop()
