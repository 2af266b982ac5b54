"""Mamba-1's selective scan in pure PyTorch: s_t = exp(dt_t A) * s_{t-1} + dt_t u_t B_t, y_t = C_t . s_t.

Each channel d and state index n decays at its own rate exp(dt_t[d] A[d, n]), so unlike Mamba-2 (one decay per
head) the recurrence does not reduce to matrix products. A Python loop per token costs one round of small kernels
per token and layer; here a prefill of Q tokens runs in chunks of about sqrt(Q) tokens instead:

1. every chunk from a zero state at once (a loop over the positions of a chunk, the chunks side by side), keeping
   its end state and its total decay exp(A * sum of dt);
2. a loop over chunks: the state entering each chunk = decay * state entering the one before + its end state;
3. every chunk again from its true entering state, reading y_t on the way.

That is about 2 sqrt(Q) + sqrt(Q) rounds of kernels instead of Q, and the same products as the token loop: no
exp(-cumsum) factor that overflows once a state has decayed (a token whose dt is 0 leaves the state as it was,
which is how padding positions are made inert). Everything here is float32.
"""

from __future__ import annotations

import math

import torch

SINGLE_CHUNK_MAX = 16  # up to this many tokens, one chunk (step 3 alone) is cheaper than three passes


def chunk_length(num_tokens: int) -> int:
    """Positions per chunk for a scan over `num_tokens`: the three passes cost about 2L + Q/L rounds."""
    if num_tokens <= SINGLE_CHUNK_MAX:
        return num_tokens
    return math.ceil(math.sqrt(2 * num_tokens))


def scan_step(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
              state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: u, dt (R, d); A (d, N); B, C (R, N); state (R, d, N) -> y (R, d), the new state."""
    state = torch.exp(dt.unsqueeze(-1) * A) * state + (dt * u).unsqueeze(-1) * B.unsqueeze(-2)
    return (state @ C.unsqueeze(-1)).squeeze(-1), state


def selective_scan(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q tokens per row: u, dt (R, Q, d); A (d, N); B, C (R, Q, N); state (R, d, N) entering the first token
    -> y (R, Q, d) and the state after the last token. Tokens with dt 0 leave the state unchanged."""
    rows, num_tokens, d_inner = u.shape
    length = chunk_length(num_tokens)
    num_chunks = -(-num_tokens // length)
    extra = num_chunks * length - num_tokens
    if extra:  # pad to whole chunks with dt 0: inert
        u, dt, B, C = (torch.nn.functional.pad(x, (0, 0, 0, extra)) for x in (u, dt, B, C))
    # (R, chunks, L, ...): chunks side by side
    u, dt, B, C = (x.view(rows, num_chunks, length, x.shape[-1]) for x in (u, dt, B, C))
    dtu = dt * u
    if num_chunks == 1:
        entering = state.unsqueeze(1)
    else:
        entering = _entering_states(dt, dtu, A, B, state)
    y, state = _run_chunks(dt, dtu, A, B, C, entering)
    return y.reshape(rows, num_chunks * length, d_inner)[:, :num_tokens], state[:, -1]


def _entering_states(dt, dtu, A, B, state):
    """Passes 1 and 2: (R, chunks, d, N) the state entering each chunk."""
    rows, num_chunks, length, d_inner = dt.shape
    local = dt.new_zeros(rows, num_chunks, d_inner, A.shape[-1])
    for t in range(length):  # each chunk from zero
        local = torch.exp(dt[:, :, t, :, None] * A) * local + dtu[:, :, t, :, None] * B[:, :, t, None, :]
    decay = torch.exp(dt.sum(2).unsqueeze(-1) * A)  # (R, chunks, d, N) over each whole chunk
    entering = []
    for c in range(num_chunks):
        entering.append(state)
        state = decay[:, c] * state + local[:, c]
    return torch.stack(entering, dim=1)


def _run_chunks(dt, dtu, A, B, C, state):
    """Pass 3: from `state` (R, chunks, d, N) entering each chunk -> y (R, chunks, L, d), states leaving them."""
    ys = []
    for t in range(dt.shape[2]):
        state = torch.exp(dt[:, :, t, :, None] * A) * state + dtu[:, :, t, :, None] * B[:, :, t, None, :]
        ys.append((state @ C[:, :, t, :, None]).squeeze(-1))
    return torch.stack(ys, dim=2), state
