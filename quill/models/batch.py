"""The input of one incremental forward step over many sequences.

Sequences of different lengths are packed back to back ("varlen"): a step may
prefill a whole prompt for one sequence, a chunk of a prompt for another and a
single token for the rest. Each model reads only what its state kind needs:
slot indices (LSTM, gated CNN) or block tables (Transformer).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

import torch

from .host_copy import to_device


@dataclass(eq=False)
class StepBatch:
    token_ids: torch.Tensor  # (T,) int64: new tokens of every sequence, concatenated
    positions: torch.Tensor  # (T,) int64: position of each token within its sequence
    query_lens: list[int]  # new tokens per sequence, sums to T
    slots: torch.Tensor | None = None  # (B,) state slot per sequence (fixed-size state)
    block_tables: torch.Tensor | None = None  # (B, max_blocks) cache blocks per sequence (paged K,V)
    logits_indices: torch.Tensor | None = None  # (K,) rows of the packed batch to score; None: all rows
    # (K,) bool per scored row: True where only the argmax is read, so a model that declares `cheap_argmax`
    # may return the argmax's log-probability there and -inf elsewhere. None: every row needs all its scores.
    argmax_only: torch.Tensor | None = None
    # Encoder-decoder models: each sequence's encoder output, as blocks of the state's EncoderCache, and its length
    cross_tables: torch.Tensor | None = None  # (B, max_source_blocks)
    cross_lens: torch.Tensor | None = None  # (B,) source tokens
    # An encoder-decoder model whose decoder attends to its source (`aligns`), asked with `want_alignment`, leaves in
    # `alignment` each sequence's attention over its source summed over its new tokens, (B, longest source of the
    # step) float32, zero past a sequence's own source: what the coverage penalty sums (server/sampling/coverage.py)
    want_alignment: bool = False
    alignment: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @cached_property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @cached_property
    def seq_of_token(self) -> torch.Tensor:
        """(T,) the sequence each packed token belongs to."""
        seqs = torch.arange(self.num_seqs, device=self.token_ids.device)
        if self.max_query_len == 1:  # a decode step copies nothing from the host (CUDA graphs capture it)
            return seqs
        return torch.repeat_interleave(seqs, self.lens, output_size=self.num_tokens)  # sized on the host: no sync

    @cached_property
    def flat_index(self) -> torch.Tensor:
        """(T,) where each packed token sits in a right-padded (B * max_query_len) layout."""
        offset = torch.arange(self.num_tokens, device=self.token_ids.device) - self.seq_starts[self.seq_of_token]
        return self.seq_of_token * self.max_query_len + offset

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(T, ...) packed -> (B, max_query_len, ...) right-padded with `fill` (a view where nothing is padded)."""
        if not self.is_padded:
            return x.view(self.num_seqs, self.max_query_len, *x.shape[1:])
        out = x.new_full((self.num_seqs * self.max_query_len, *x.shape[1:]), fill)
        out[self.flat_index] = x
        return out.view(self.num_seqs, self.max_query_len, *x.shape[1:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, max_query_len, ...) right-padded -> (T, ...) packed."""
        flat = x.reshape(self.num_seqs * self.max_query_len, *x.shape[2:])
        return flat[self.flat_index] if self.is_padded else flat

    def sum_alignment(self, weights: torch.Tensor) -> None:
        """(T, keys) each packed token's attention over its sequence's source, zero past it -> `alignment`."""
        width = int(self.cross_lens.max())
        out = torch.zeros(self.num_seqs, width, dtype=torch.float32, device=weights.device)
        self.alignment = out.index_add_(0, self.seq_of_token, weights[:, :width].float())

    @cached_property
    def seq_starts(self) -> torch.Tensor:
        """(B,) index of each sequence's first new token in the packed batch."""
        return torch.cumsum(self.lens, 0) - self.lens

    @cached_property
    def last_indices(self) -> torch.Tensor:
        """(B,) index of each sequence's last new token in the packed batch."""
        return self.seq_starts + self.lens - 1

    @cached_property
    def lens(self) -> torch.Tensor:
        """(B,) query_lens on the device, copied once for every layer that reads them."""
        return to_device(self.query_lens, self.token_ids.device, torch.long)

    @cached_property
    def is_padded(self) -> bool:
        """Whether `pad` adds padding: some sequence brings fewer tokens than the longest."""
        return min(self.query_lens) < self.max_query_len

    def window_index(self, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A convolution's windows over packed tokens, without padding: indices into the rows [each sequence's
        `keep` earlier inputs (B * keep rows, sequence by sequence, oldest first), then the packed new inputs (T)].
        Returns (T, keep + 1) each new token's window, oldest first, and (B, keep) each sequence's last `keep`
        inputs (its window for the next step)."""
        device = self.token_ids.device
        history = torch.arange(self.num_seqs, device=device)[:, None] * keep + keep  # one past each window's end
        offsets = torch.arange(-keep, 1, device=device)
        start = self.seq_starts[self.seq_of_token][:, None]
        at = torch.arange(self.num_tokens, device=device)[:, None] - start + offsets  # among its new tokens
        new = self.num_seqs * keep + start
        windows = torch.where(at >= 0, new + at, history[self.seq_of_token] + at)
        at = self.lens[:, None] + offsets[:-1]
        ends = torch.where(at >= 0, self.num_seqs * keep + self.seq_starts[:, None] + at, history + at)
        return windows, ends

    def last_inputs(self, inputs: torch.Tensor, keep: int, dim: int = 1) -> torch.Tensor:
        """`inputs` (B, ...) holding along `dim` each sequence's `keep` earlier inputs then its new ones, right-padded
        to max_query_len -> each sequence's last `keep` real inputs (a convolution's window for its next step).
        Sequence b's real inputs end at keep + query_lens[b], so its window starts at query_lens[b]."""
        if not self.is_padded:  # the last `keep` of every row
            return inputs.narrow(dim, inputs.shape[dim] - keep, keep)
        index = self.lens[:, None] + torch.arange(keep, device=inputs.device)  # (B, keep)
        shape = [1] * inputs.dim()
        shape[0], shape[dim] = self.num_seqs, keep
        size = list(inputs.shape)
        size[dim] = keep
        return inputs.gather(dim, index.view(shape).expand(size))

    def slide_windows(self, windows: torch.Tensor, where, new: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """A convolution's input: each sequence's stored window `windows[where]` (B, ..., K - 1 along `dim`) then
        its new inputs `new` (padded to max_query_len along `dim`), joined in `new`'s dtype. The stored windows
        become each sequence's last K - 1 real inputs, in the state's dtype."""
        window = windows[where]
        inputs = torch.cat([window.to(new.dtype), new], dim)
        windows[where] = self.last_inputs(inputs, window.shape[dim], dim).to(windows.dtype)
        return inputs

    @classmethod
    def whole(cls, tokens: torch.Tensor) -> "StepBatch":
        """(B, T) token ids as B whole sequences from position 0, sequence b in slot b, every row scored."""
        num_seqs, length = tokens.shape
        device = tokens.device
        return cls(token_ids=tokens.flatten(), positions=torch.arange(length, device=device).repeat(num_seqs),
                   query_lens=[length] * num_seqs, slots=torch.arange(num_seqs, device=device))

    @classmethod
    def build(
        cls,
        new_tokens: list[list[int]],
        start_positions: list[int],
        *,
        slots: list[int] | None = None,
        block_tables: list[list[int]] | None = None,
        logits: str = "last",
        device: torch.device | str = "cpu",
    ) -> "StepBatch":
        """Pack per-sequence token lists; `logits` is "last" (one row per sequence) or "all"."""
        if len(new_tokens) != len(start_positions) or any(len(t) == 0 for t in new_tokens):
            raise ValueError("every sequence in a step needs at least one new token and a start position")
        token_ids = to_device([t for seq in new_tokens for t in seq], device, torch.long)
        positions = to_device(
            [start + i for seq, start in zip(new_tokens, start_positions) for i in range(len(seq))], device, torch.long
        )
        tables = None
        if block_tables is not None:
            width = max(len(t) for t in block_tables)
            tables = to_device([t + [0] * (width - len(t)) for t in block_tables], device, torch.long)
        batch = cls(
            token_ids=token_ids,
            positions=positions,
            query_lens=[len(t) for t in new_tokens],
            slots=None if slots is None else to_device(slots, device, torch.long),
            block_tables=tables,
        )
        if logits == "last":
            batch.logits_indices = batch.last_indices
        elif logits != "all":
            raise ValueError(f"logits must be 'last' or 'all', not {logits!r}")
        return batch


def split_decodes(batch: StepBatch) -> list[tuple[StepBatch, torch.Tensor | None]]:
    """The step's sequences in parts for a recurrent model, each with the packed tokens it holds (None: all, in
    order). One part, unless the step mixes one-token sequences with longer ones: then those make one part (run as
    a recurrent step) and the others another (run padded to their longest chunk), so that a decode row is not
    padded to the longest chunk, nor costs its work."""
    lengths = batch.query_lens
    if batch.max_query_len == 1 or min(lengths) > 1:
        return [(batch, None)]
    starts = list(accumulate(lengths, initial=0))
    decodes = [s for s, n in enumerate(lengths) if n == 1]
    chunks = [s for s, n in enumerate(lengths) if n > 1]
    device = batch.token_ids.device
    parts = []
    # each part's token indices built a sequence at a time, not a token at a time: a chunk is thousands of tokens
    for seqs, tokens in ((decodes, torch.tensor([starts[s] for s in decodes])),
                         (chunks, torch.cat([torch.arange(starts[s], starts[s + 1]) for s in chunks]))):
        tokens = tokens.to(device, non_blocking=True)
        part = StepBatch(token_ids=batch.token_ids[tokens], positions=batch.positions[tokens],
                         query_lens=[lengths[s] for s in seqs], slots=batch.slots[to_device(seqs, device, torch.long)])
        parts.append((part, tokens))
    return parts


def run_by_parts(parts: list[tuple[StepBatch, torch.Tensor | None]], run, *packed: torch.Tensor) -> torch.Tensor:
    """`run(part, *its rows of packed)` for each of `split_decodes`' parts; its result (a row per token of the part)
    joined back in the step's packed order."""
    if len(parts) == 1:
        return run(parts[0][0], *packed)
    joined = None
    for part, tokens in parts:
        result = run(part, *(t[tokens] for t in packed))
        if joined is None:
            joined = result.new_empty((packed[0].shape[0], *result.shape[1:]))
        joined[tokens] = result
    return joined
