"""Compile, before the engine reports ready, the kernel variants serving will meet.

Compiled Triton builds a kernel on its first launch with each new set of compile-time constants, which costs a
second or more. The paged-attention kernel has one variant per query tile size: one token (decode steps) and
2, 4, 8 or 16 (steps where some sequence brings a prompt chunk: the longest chunk, rounded up to a power of two,
at most 16). Without this, those compiles land in the first requests' steps (the H100's first benchmark steps
took 0.13 s each). One tiny step per tile size, on a state of its own, compiles them all; the fused layer kernels
compile on the way.
"""

from __future__ import annotations

import torch

from quill.models.batch import StepBatch
from quill.models.state import new_model_state, state_parts

# A step's longest new-token run -> the tile size it compiles (triton_backend.TritonPagedAttention.build).
QUERY_LENS = (1, 2, 4, 8, 16)


def warm_attention_variants(model, block_size: int) -> list[int]:
    """Run one step per query length of QUERY_LENS on a throwaway state; returns the lengths run (none for a model
    that does not attend through the Triton backend)."""
    if getattr(model, "attention_backend", None) != "triton":
        return []
    device = next(model.parameters()).device
    limit = getattr(model.config, "max_seq_len", None) or max(QUERY_LENS)  # learned positions end there
    lens = [n for n in QUERY_LENS if n <= limit]
    blocks_per_seq = -(-max(lens) // block_size)
    state = new_model_state(model, blocks_per_seq, 1, block_size)
    _, slots = state_parts(state)
    with torch.inference_mode():
        for n in lens:
            batch = StepBatch.build([[0] * n], [0], block_tables=[list(range(blocks_per_seq))],
                                    slots=None if slots is None else [0], device=device)
            model.step(batch, state)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return lens
