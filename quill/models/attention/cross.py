"""Cross-attention: a decoder's queries over its request's encoder output, kept as K,V in blocks of their own.

The encoder runs once per request and writes every decoder layer's cross-attention K,V into blocks of an
`EncoderCache` (quill/models/state.py); each sequence of the request (every beam, every sample) reads the same
blocks, listed in its row of the step's `cross_tables` with the source's length in `cross_lens`. Nothing is ever
written here during a decoder step, and no query is causal to the source: every packed decoder token attends to
all of its sequence's source keys. So each token is one row of a paged decode, whatever its sequence's query
length: the CPU kernel (cpu_kernel.py) reads the blocks in place, as does the Triton kernel (triton_kernel.py: each
token a sequence of its own at its source's last position, so every source key is visible and no other is read);
elsewhere the rows' blocks are gathered at the table's full width (the longest source the model takes) and
attended with masked SDPA.
"""

from __future__ import annotations

from functools import cached_property

import torch
import torch.nn.functional as F

from ..batch import StepBatch
from .cpu_kernel import kernel


class CrossAttention:
    """A step's cross-attention metadata, built once and shared by the decoder's layers."""

    def __init__(self, batch: StepBatch, block_size: int, scale: float, kernel: str | None):
        rows = batch.seq_of_token  # one query row per packed token
        self.tables = batch.cross_tables if batch.max_query_len == 1 else batch.cross_tables[rows]
        self.lens = batch.cross_lens if batch.max_query_len == 1 else batch.cross_lens[rows]
        self.block_size = block_size
        self.scale = scale
        self.kernel = kernel  # "cpu", "triton", or None: gathered blocks and masked SDPA
        self.alignment: torch.Tensor | None = None  # (T, keys) summed over the layers that were asked to align
        self.num_aligned = 0

    @classmethod
    def build(cls, batch: StepBatch, block_size: int, scale: float, self_attention: str,
              dtype: torch.dtype) -> "CrossAttention":
        """`self_attention`: the name of the backend the decoder's self-attention runs on; its paged kernel reads
        the encoder blocks too where it reads the decoder's (the CPU's: float32 only)."""
        kernel = {"cpu": "cpu" if dtype == torch.float32 else None, "triton": "triton"}.get(self_attention)
        return cls(batch, block_size, scale, kernel)

    @cached_property
    def mask(self) -> torch.Tensor:
        """(T, keys) which of the gathered blocks' rows are each token's source."""
        keys = torch.arange(self.tables.shape[1] * self.block_size, device=self.lens.device)
        return keys[None, :] < self.lens[:, None]

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                align: bool = False) -> torch.Tensor:
        """q (T, H, hd) of the packed decoder tokens; k_cache, v_cache (num_blocks, block_size, H, hd) of one
        layer's encoder output -> (T, H * hd). `align`: also add this layer's attention weights, averaged over its
        heads, to `alignment`."""
        if align:
            self._align(q, k_cache)
        if self.kernel == "cpu":
            return kernel().paged_decode_attention(q, k_cache, v_cache, self.tables, self.lens, self.scale).flatten(1)
        if self.kernel == "triton":
            return self._triton(q, k_cache, v_cache).flatten(1)
        k = k_cache[self.tables].flatten(1, 2)  # (T, width * block_size, H, hd)
        v = v_cache[self.tables].flatten(1, 2)
        out = F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=self.mask[:, None, None, :], scale=self.scale)  # (T, H, 1, hd)
        return out.flatten(1)

    @cached_property
    def _triton_tiles(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(each token's source's last row, sequence starts, tile starts) for the Triton kernel, once a step for every
        layer: every token a sequence of one query at its source's last row. Made on the device: capturable."""
        tokens = torch.arange(self.lens.shape[0] + 1, dtype=torch.int32, device=self.lens.device)
        # no row past the table (a graph's padding rows carry a length that points nowhere)
        last = self.lens.clamp(max=self.tables.shape[1] * self.block_size).to(torch.int32) - 1
        return last, tokens, torch.zeros_like(tokens[:-1])

    def _triton(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        from .triton_kernel import paged_attention  # imported late: see that module's note on TRITON_INTERPRET

        last, tokens, starts = self._triton_tiles
        return paged_attention(q, k_cache, v_cache, last, self.tables, tokens, tokens[:-1], starts, block_q=1,
                               scale=self.scale)

    def _align(self, q: torch.Tensor, k_cache: torch.Tensor) -> None:
        """The weights the attention gives each source row, recomputed apart (the kernels return none): only steps
        of requests with a coverage penalty ask."""
        k = k_cache[self.tables].flatten(1, 2).float()  # (T, keys, H, hd)
        scores = torch.einsum("thd,tkhd->thk", q.float(), k) * self.scale
        weights = scores.masked_fill(~self.mask[:, None, :], float("-inf")).softmax(-1).mean(1)
        self.alignment = weights if self.alignment is None else self.alignment + weights
        self.num_aligned += 1

    def mean_alignment(self) -> torch.Tensor:
        """(T, keys) each token's attention over its source, averaged over the layers that aligned."""
        return self.alignment / self.num_aligned
