"""Batched logits processors: every row of a (B, V) float32 tensor with its own settings.

Each function is pure (returns a new tensor, never writes its input) and takes the per-row
settings as (B,) tensors, so one call serves a batch that mixes requests. A setting's "off"
value leaves its row bit-for-bit unchanged. Masked tokens get -inf. The filters reproduce
Hugging Face's warpers (`transformers.generation.logits_process`) with min_tokens_to_keep=1,
row by row, including their float32 arithmetic.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain

import torch

from quill.models.host_copy import to_device

NEG_INF = float("-inf")


def token_counts(token_ids: list[list[int]], vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """(B, V) int32: how often each token id occurs in each row's list, built by one scatter_add.

    Ids >= vocab_size (an embedding table wider than the output layer) are not counted.
    """
    num_rows = len(token_ids)
    lengths = to_device([len(ids) for ids in token_ids], device, torch.long)
    flat_ids = to_device(list(chain.from_iterable(token_ids)), device, torch.long)  # (N,)
    rows = torch.repeat_interleave(torch.arange(num_rows, device=device), lengths, output_size=flat_ids.shape[0])
    # One spare column per row catches out-of-range ids; it is dropped on return.
    width = vocab_size + 1
    counts = torch.zeros(num_rows * width, dtype=torch.int32, device=device)
    counts.scatter_add_(0, rows * width + flat_ids.clamp(max=vocab_size), torch.ones_like(flat_ids, dtype=torch.int32))
    return counts.view(num_rows, width)[:, :vocab_size]


@lru_cache(maxsize=None)
def _bits_of_byte(device: torch.device) -> torch.Tensor:
    """(256, 8) bool: the bits of each byte value, made once per device rather than every constrained step."""
    return ((torch.arange(256, device=device).unsqueeze(1) >> torch.arange(8, device=device)) & 1).bool()


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(C, words) int32, bit t % 32 of word t // 32 set when token t is allowed -> (C, V) bool.

    Read as little-endian bytes, token t is bit t % 8 of byte t // 8, so a 256-row table of each byte's 8 bits
    unpacks a row with one gather, writing 1 byte per token (shifting the words wrote an int32 per token first).
    """
    bits_of_byte = _bits_of_byte(bitmask.device)
    as_bytes = bitmask.contiguous().view(torch.uint8).reshape(-1)  # (C * words * 4,); little-endian on x86 and CUDA
    return bits_of_byte.index_select(0, as_bytes.int()).view(bitmask.shape[0], -1)[:, :vocab_size]


def apply_allowed_tokens(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """-inf wherever the grammar of row rows[i] forbids a token (bitmask[i], llguidance's layout); other rows
    are left as they are. rows: (C,) int64, bitmask: (C, words) int32 on the logits' device."""
    forbidden = ~unpack_bitmask(bitmask, logits.shape[-1])  # (C, V)
    if rows.shape[0] == logits.shape[0]:  # every row constrained, in order (the caller checks on the host)
        return logits.masked_fill(forbidden, NEG_INF)
    constrained = logits.index_select(0, rows).masked_fill(forbidden, NEG_INF)
    return logits.index_copy(0, rows, constrained)


def apply_banned_tokens(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """-inf at (rows[i], token_ids[i]); used to keep EOS and stop ids out until min_tokens."""
    return logits.index_put((rows, token_ids), logits.new_full((), NEG_INF))


def apply_logit_bias(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """Adds values[i] at (rows[i], token_ids[i]); the OpenAI logit_bias, flattened over the batch."""
    return logits.index_put((rows, token_ids), values.to(logits.dtype), accumulate=True)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF's RepetitionPenaltyLogitsProcessor per row: a seen token's logit is divided by the penalty
    when positive and multiplied by it when negative, so a penalty > 1 always lowers it.

    seen: (B, V) bool, token occurs in the prompt or the output. penalty: (B,), 1 = off.
    """
    penalty = penalty.to(logits.dtype).unsqueeze(1)  # (B, 1)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def apply_presence_frequency_penalties(
    logits: torch.Tensor, output_counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """OpenAI's rule: logit -= presence * (count > 0) + frequency * count, counting generated tokens only.

    output_counts: (B, V) int. presence, frequency: (B,), 0 = off.
    """
    counts = output_counts.to(logits.dtype)
    penalty = frequency.to(logits.dtype).unsqueeze(1) * counts
    penalty = penalty + presence.to(logits.dtype).unsqueeze(1) * (counts > 0).to(logits.dtype)
    return logits - penalty


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divides each row by its temperature (B,); rows at 0 are greedy and left as they are."""
    temperature = temperature.to(logits.dtype)
    temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return logits / temperature.unsqueeze(1)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int | None = None) -> torch.Tensor:
    """Keeps the k largest logits of each row; top_k (B,) <= 0 or >= V is off.

    Ties at the boundary are all kept, as HF's TopKLogitsWarper and vLLM do: a token survives
    when its logit is >= the k-th largest, so a row may keep more than k tokens when several
    share the k-th value. `max_top_k` (the largest active k, known on the CPU) bounds the
    torch.topk width; None means V.
    """
    vocab_size = logits.shape[-1]
    width = vocab_size if max_top_k is None else max(1, min(max_top_k, vocab_size))
    is_on = (top_k > 0) & (top_k < vocab_size)
    k = top_k.clamp(min=1, max=width)  # (B,)
    top_values = logits.topk(width, dim=-1).values  # (B, width), descending
    kth = top_values.gather(1, (k - 1).unsqueeze(1))  # (B, 1)
    kth = kth.masked_fill(~is_on.unsqueeze(1), NEG_INF)
    return logits.masked_fill(logits < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter: keeps the smallest set of most probable tokens whose mass reaches p.

    HF's TopPLogitsWarper row by row: sort ascending, and drop a token when the mass of it and all
    less probable tokens is <= 1 - p, i.e. when the more probable tokens already reach p. The most
    probable token is always kept. top_p: (B,) float64, so 1 - p is rounded to float32 once, as HF's
    Python-float threshold is; p = 1 is off (HF does not run the warper then).
    """
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=False)  # (B, V) ascending
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V) mass of tokens up to this one
    threshold = (1 - top_p.to(torch.float64)).to(logits.dtype).unsqueeze(1)  # (B, 1)
    drop_sorted = cumulative <= threshold
    drop_sorted[:, -1] = False  # min_tokens_to_keep = 1: the most probable token stays
    drop_sorted &= (top_p < 1).unsqueeze(1)
    drop = drop_sorted.scatter(1, sorted_ids, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keeps tokens whose probability is >= min_p * (the row's largest probability); min_p (B,), 0 = off.

    The most probable token always passes (min_p <= 1), so no row is left empty.
    """
    probs = logits.softmax(dim=-1)  # (B, V)
    threshold = min_p.to(logits.dtype).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)  # (B, 1)
    return logits.masked_fill(probs < threshold, NEG_INF)
