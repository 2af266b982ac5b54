"""T5's attention: no 1/sqrt(d) scale, and a learned bias per head added to each score, looked up by the bucket of
the key's position relative to the query's (Raffel et al. 2020). T5 and mT5 read the first layer's table in every
layer of the stack; umT5 gives each layer's self-attention its own table. The buckets depend on the positions alone,
so a step computes them once and each table only looks its values up.

The decoder's self-attention keeps its K,V in the paged cache like any other (`slot_mapping`, `write_kv`), and
attends over each sequence's gathered blocks with the bias and the causal mask folded into one additive mask for
SDPA (no kernel backend takes a per-head bias).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import StepBatch
from .backend import slot_mapping, write_kv


def relative_buckets(relative: torch.Tensor, num_buckets: int, max_distance: int, bidirectional: bool) -> torch.Tensor:
    """Key position minus query position -> T5's bucket: exact for small distances, logarithmic up to
    `max_distance`; the encoder tells earlier from later keys (half the buckets each), the decoder sees only
    earlier ones."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = -torch.clamp(relative, max=0)
    exact = num_buckets // 2
    large = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact)
                     * (num_buckets - exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, large)


class RelativeBias(nn.Module):
    """A bias table, (num_buckets, n_heads): a stack's (T5) or one layer's (umT5)."""

    def __init__(self, num_buckets: int, n_heads: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads))
        self.max_distance, self.bidirectional = max_distance, bidirectional

    def buckets(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """query_pos (..., Q), key_pos (..., K) -> (..., Q, K) bucket ids, the same for every table of a stack."""
        relative = key_pos[..., None, :] - query_pos[..., :, None]
        return relative_buckets(relative, self.weight.shape[0], self.max_distance, self.bidirectional)

    def lookup(self, buckets: torch.Tensor) -> torch.Tensor:
        """(..., Q, K) bucket ids -> (..., H, Q, K) float32 bias."""
        return F.embedding(buckets, self.weight).float().movedim(-1, -3)

    def forward(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """query_pos (..., Q), key_pos (..., K) -> (..., H, Q, K) float32 bias."""
        return self.lookup(self.buckets(query_pos, key_pos))


class RelativeBiasAttention:
    """A step's paged self-attention with T5's bias, built once and shared by the decoder's layers (umT5: each
    layer's own copy, `with_bias`)."""

    def __init__(self, batch: StepBatch, block_size: int, bias: RelativeBias, scale: float, dtype: torch.dtype):
        self.batch, self.scale, self.dtype = batch, scale, dtype
        self.slots = slot_mapping(batch, block_size)
        self.tables = batch.block_tables  # (B, W): the runner gives as many columns as the longest sequence needs
        width = self.tables.shape[1] * block_size
        query_pos = batch.pad(batch.positions, fill=-1)  # (B, Q); padding rows see nothing they could spoil
        key_pos = torch.arange(width, device=query_pos.device).expand(batch.num_seqs, width)
        self.buckets = bias.buckets(query_pos.clamp(min=0), key_pos)  # (B, Q, K)
        self.hidden = key_pos[:, None, None, :] > query_pos[:, None, :, None]  # (B, 1, Q, K)
        self.padding = (query_pos < 0)[:, None, :]  # (B, 1, Q)
        self.mask = self._mask(bias)

    def _mask(self, bias: RelativeBias) -> torch.Tensor:
        """The bias and the causal mask as one additive (B, H, Q, K) mask."""
        mask = bias.lookup(self.buckets).masked_fill(self.hidden, float("-inf")).to(self.dtype)
        mask[:, :, :, 0].masked_fill_(self.padding, 0.0)  # a padding row sees key 0 (no NaN)
        return mask

    def with_bias(self, bias: RelativeBias) -> RelativeBiasAttention:
        """This step's attention with another layer's table (umT5), its slots and buckets shared."""
        other = copy.copy(self)
        other.mask = self._mask(bias)
        return other

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        """q (T, H, hd), k and v (T, H, hd) of the packed new tokens -> (T, H * hd)."""
        write_kv(k, v, k_cache, v_cache, self.slots)
        batch = self.batch
        keys = k_cache[self.tables].flatten(1, 2).transpose(1, 2)  # (B, H, K, hd)
        values = v_cache[self.tables].flatten(1, 2).transpose(1, 2)
        out = F.scaled_dot_product_attention(batch.pad(q).transpose(1, 2), keys, values, attn_mask=self.mask,
                                             scale=self.scale)  # (B, H, Q, hd)
        return batch.unpad(out.transpose(1, 2)).flatten(1)
