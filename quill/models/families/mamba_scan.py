"""Mamba-1's selective scan in pure PyTorch: s_t = exp(dt_t A) * s_{t-1} + dt_t u_t B_t, y_t = C_t . s_t.

Each channel d and state index n decays at its own rate exp(dt_t[d] A[d, n]), so unlike Mamba-2 (one decay per
head) the recurrence does not reduce to matrix products. A loop over the tokens costs a round of four or five
kernels per token and layer: on a GPU, where a kernel costs a launch whatever its size, a prefill of Q tokens runs
in chunks of L ~ sqrt(Q) / 2 tokens instead:

1. every chunk from a zero state at once (a loop over the positions of a chunk, the chunks side by side), keeping
   its end state and its total decay exp(A * sum of dt);
2. a loop over chunks: the state entering each chunk = decay * state entering the one before + its end state;
3. every chunk again from its true entering state, reading y_t on the way.

That is about 2L + Q/L rounds instead of Q (about 130 instead of 2,000 for a 2,000-token prompt), with the same
products as the token loop: no exp(-cumsum) factor that overflows once a state has decayed. It does the
recurrence's work twice, which a CPU pays in full (a kernel call costs little there next to its work, and the
token loop keeps its (d, N) state in cache): measured on one core for a layer of mamba-130m's width, 2,000 tokens,
0.12 s as one chunk against 0.18-0.24 s in chunks of 16 to 256. So on a CPU the scan is one chunk: the token loop.

A token whose dt is 0 leaves the state as it was: that is how padding positions are made inert. Everything here
is float32.
"""

from __future__ import annotations

import math

import torch

SINGLE_CHUNK_MAX = 8  # up to this many tokens, one chunk (pass 3 alone) launches fewer kernels than three passes


def chunk_length(num_tokens: int, device: torch.device) -> int:
    """Positions per chunk for a scan over `num_tokens` on `device` (see the module docstring). On a GPU,
    passes 1 and 3 launch about 9 kernels per position and pass 2 two per chunk: 9L + 2Q/L is least at
    L = sqrt(2Q / 9), about sqrt(Q) / 2."""
    if device.type == "cpu" or num_tokens <= SINGLE_CHUNK_MAX:
        return num_tokens
    return math.ceil(math.sqrt(num_tokens) / 2)


def _advance(state: torch.Tensor, dt: torch.Tensor, dtu: torch.Tensor, A: torch.Tensor, B: torch.Tensor):
    """One token: state (..., d, N); dt, dtu = dt * u (..., d); A (d, N); B (..., N) -> the next state (a new
    tensor: `state` is left as it was)."""
    decay = (dt.unsqueeze(-1) * A).exp_()
    return torch.addcmul(decay.mul_(state), dtu.unsqueeze(-1), B.unsqueeze(-2))


def scan_step(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
              state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: u, dt (R, d); A (d, N); B, C (R, N); state (R, d, N) -> y (R, d), the new state."""
    state = _advance(state, dt, dt * u, A, B)
    return (state @ C.unsqueeze(-1)).squeeze(-1), state


def selective_scan(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   state: torch.Tensor, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q tokens per row: u, dt (R, Q, d); A (d, N); B, C (R, Q, N); state (R, d, N) entering the first token
    -> y (R, Q, d) and the state after the last token. Tokens with dt 0 leave the state unchanged.
    `length`: positions per chunk; None: `chunk_length`'s choice for the device."""
    rows, num_tokens, d_inner = u.shape
    length = min(length or chunk_length(num_tokens, u.device), num_tokens)
    num_chunks = -(-num_tokens // length)
    extra = num_chunks * length - num_tokens
    if extra:  # pad to whole chunks with dt 0: inert
        u, dt, B, C = (torch.nn.functional.pad(x, (0, 0, 0, extra)) for x in (u, dt, B, C))
    # (R, chunks, L, ...): chunks side by side
    u, dt, B, C = (x.reshape(rows, num_chunks, length, x.shape[-1]) for x in (u, dt, B, C))
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
    local = dt.new_zeros(rows, num_chunks - 1, d_inner, A.shape[-1])  # the last chunk's end is not needed
    for t in range(length):  # each chunk from zero
        local = _advance(local, dt[:, :-1, t], dtu[:, :-1, t], A, B[:, :-1, t])
    decay = torch.exp(dt[:, :-1].sum(2).unsqueeze(-1) * A)  # (R, chunks - 1, d, N) over each whole chunk
    entering = [state]
    for c in range(num_chunks - 1):
        state = decay[:, c] * state + local[:, c]
        entering.append(state)
    return torch.stack(entering, dim=1)


def _run_chunks(dt, dtu, A, B, C, state):
    """Pass 3: from `state` (R, chunks, d, N) entering each chunk -> y (R, chunks, L, d), states leaving them."""
    ys = []
    for t in range(dt.shape[2]):
        state = _advance(state, dt[:, :, t], dtu[:, :, t], A, B[:, :, t])
        ys.append((state @ C[:, :, t, :, None]).squeeze(-1))
    return torch.stack(ys, dim=2), state
