"""Offline generation for one prompt: the model's incremental state driven directly.

This is what `quill generate` runs; the server's engine batches many requests instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .batch import StepBatch
from .checkpoint import LoadedModel
from .tokenizer import IncrementalDecoder

BLOCK_SIZE = 16


def _pick(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@torch.inference_mode()
def generate(
    loaded: LoadedModel,
    prompt: str,
    max_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int | None = None,
    ignore_eos: bool = False,
) -> Iterator[str]:
    """Yield text deltas of a continuation of `prompt`."""
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt is empty after tokenization")
    limit = loaded.max_seq_len
    if limit is not None and len(ids) + max_tokens > limit:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's context of {limit} tokens"
        )
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())
    if model.state_kind == "paged_kv":
        num_blocks = -(-(len(ids) + max_tokens) // BLOCK_SIZE)
        state = model.new_state(num_blocks, block_size=BLOCK_SIZE)
        where = dict(block_tables=[list(range(num_blocks))])
    else:
        state = model.new_state(1)
        where = dict(slots=[0])
    decoder = IncrementalDecoder(tokenizer)
    new, position = ids, 0
    for _ in range(max_tokens):
        batch = StepBatch.build([new], [position], device=loaded.device, **where)
        token = _pick(model.step(batch, state)[0], temperature, top_k, generator)
        position += len(new)
        new = [token]
        if token in loaded.eos_token_ids and not ignore_eos:
            break
        yield decoder.push(token)
    yield decoder.flush()
