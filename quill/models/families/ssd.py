"""The Mamba-2 selective state-space recurrence (SSD: "state space duality"), in pure PyTorch.

Per head h, with a scalar decay A_h < 0 and a (head_dim, d_state) state S:
    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T        y_t = S_t C_t
B and C are shared by the heads of a group (n_groups groups of num_heads / n_groups heads).

`ssd_step` is one token of it (decode: no host syncs, CUDA-graph capturable). `ssd_chunked` runs many tokens
at once in chunks: inside a chunk the outputs are a masked (chunk x chunk) matrix product, like causal
attention with decays for weights; only the chunk-boundary states go through a short loop, one iteration per
chunk, not per token. Both are the same function of their inputs, up to float rounding (~1e-6 in float32),
so a prompt may be cut into steps anywhere. A token with dt = 0 leaves the state as it was: callers give
padding positions dt = 0.

Shapes: x (batch, T, heads, head_dim), dt (batch, T, heads), A (heads,), B and C (batch, T, groups, d_state),
state (batch, heads, head_dim, d_state). Everything float32: the state sums thousands of decayed terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: x (b, h, p), dt (b, h), B and C (b, g, n), state (b, h, p, n) -> y (b, h, p), new state."""
    b, h, p = x.shape
    g, n = B.shape[1:]
    r = h // g  # heads per group
    decay = torch.exp(dt * A).view(b, g, r, 1, 1)
    update = (dt[..., None] * x).view(b, g, r, p, 1) * B.view(b, g, 1, 1, n)
    state = state.view(b, g, r, p, n) * decay + update
    y = torch.einsum("bgrpn,bgn->bgrp", state, C)
    return y.reshape(b, h, p), state.view(b, h, p, n)


def _segment_sums(a: torch.Tensor) -> torch.Tensor:
    """(..., L) log-decays -> (..., L, L): [l, s] = a[s+1] + ... + a[l] for s <= l, -inf above the diagonal.
    Summed directly rather than as cumsum[l] - cumsum[s], whose cancellation loses digits over long chunks."""
    length = a.shape[-1]
    strictly_lower = torch.ones(length, length, dtype=torch.bool, device=a.device).tril(-1)
    sums = a[..., :, None].expand(*a.shape, length).masked_fill(~strictly_lower, 0).cumsum(-2)
    lower = torch.ones(length, length, dtype=torch.bool, device=a.device).tril()
    return sums.masked_fill(~lower, -torch.inf)


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                state: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """T tokens from `state`: x (b, T, h, p), dt (b, T, h), B and C (b, T, g, n) -> y (b, T, h, p), end state."""
    b, t, h, p = x.shape
    g, n = B.shape[2:]
    r = h // g
    length = min(chunk_size, t)
    pad = -t % length  # padded tokens have dt = 0: they change nothing
    if pad:
        x, dt, B, C = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (x, dt, B, C))
    c = (t + pad) // length
    x_dt = (x * dt[..., None]).view(b, c, length, g, r, p)
    a = (dt * A).view(b, c, length, g, r).permute(0, 1, 3, 4, 2)  # (b, c, g, r, L) log-decay of each token
    B, C = B.view(b, c, length, g, n), C.view(b, c, length, g, n)

    # Within a chunk: y_l = sum_{s <= l} (C_l . B_s) exp(a_{s+1} + ... + a_l) dt_s x_s.
    decay = torch.exp(_segment_sums(a))  # (b, c, g, r, L, S)
    scores = torch.einsum("bclgn,bcsgn->bcgls", C, B)[:, :, :, None] * decay  # (b, c, g, r, L, S)
    y = torch.einsum("bcgrls,bcsgrp->bclgrp", scores, x_dt)

    # Each chunk's own contribution to the state at its end, as if it started from zero.
    to_end = decay[..., -1, :].permute(0, 1, 4, 2, 3)  # (b, c, S, g, r): exp(a_{s+1} + ... + a_last)
    B_to_end = to_end[..., None] * B[:, :, :, :, None, :]  # (b, c, S, g, r, n)
    chunk_states = torch.einsum("bcsgrn,bcsgrp->bcgrpn", B_to_end, x_dt)

    # The state entering each chunk: one step per chunk of S <- exp(sum of the chunk's a) S + chunk state.
    chunk_decay = torch.exp(a.sum(-1))[..., None, None]  # (b, c, g, r, 1, 1)
    running, starts = state.view(b, g, r, p, n), []
    for i in range(c):
        starts.append(running)
        running = chunk_decay[:, i] * running + chunk_states[:, i]
    starts = torch.stack(starts, dim=1)  # (b, c, g, r, p, n)

    # What the entering state adds to each output: exp(a_first + ... + a_l) C_l . S_start.
    from_start = torch.exp(a.cumsum(-1)).permute(0, 1, 4, 2, 3)[..., None]  # (b, c, L, g, r, 1)
    y = y + torch.einsum("bclgn,bcgrpn->bclgrp", C, starts) * from_start
    return y.reshape(b, c * length, h, p)[:, :t], running.reshape(b, h, p, n)
