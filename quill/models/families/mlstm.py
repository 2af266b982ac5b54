"""The mLSTM cell of xLSTM (Beck et al. 2024): a matrix memory written with exponential gates.

Per head, token t with query q, key k, value v, input gate i and forget gate f (pre-activations):
    m_t = max(log sigmoid(f_t) + m_{t-1}, i_t)                 the stabiliser, in log space
    C_t = exp(log sigmoid(f_t) + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
    n_t = (same gates) n_{t-1} + exp(i_t - m_t) k_t
    h_t = (q_t C_t) / (max(|q_t . n_t|, exp(-m_t)) + eps),   q scaled by 1/sqrt(d_qk)
C and n are stored divided by exp(m), so that exponential input gates never overflow; h does not depend on m
except through `eps`. The zero state (C = 0, n = 0, m = 0) is the empty sequence, as in transformers and the
original xlstm package, and every path below keeps that convention, so a state saved by one continues in another.

Two exact forms of the same recurrence: `step` (one token, the decode step) and `chunk` (many tokens from a saved
state at once: unrolled, the weight of token s in the state after token t is exp(b_t - b_s + i_s - m_t) with b the
running sum of log forget gates). Both run in the state's dtype, float32 whatever the model's (float64 in tests):
the gates are exponentials and the memory a sum over the whole history, which half precision would round away.

Why the chunkwise form for prefill: for 2,000 tokens of 4 heads (64 x 128) it takes 14 ms a block where a loop of
`step` takes 175 ms (2-core CPU), with the same float32 error (6-7e-5 of each row's scale against float64; in
float64 the two agree to 2e-11). Pieces of 32 to 128 tokens cost the same; the (L, L) weights grow with L.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # C (B, H, Dk, Dv), n (B, H, Dk), m (B, H)


def step(q, k, v, i, f, state: State, eps: float) -> tuple[torch.Tensor, State]:
    """One token: q, k (B, H, Dk), v (B, H, Dv), i, f (B, H) pre-activations -> h (B, H, Dv), new state."""
    C, n, m = state
    log_f = F.logsigmoid(f)
    m_new = torch.maximum(log_f + m, i)
    keep = torch.exp(log_f + m - m_new)
    write = torch.exp(i - m_new)
    C = keep[..., None, None] * C + (write[..., None] * k).unsqueeze(-1) * v.unsqueeze(-2)
    n = keep[..., None] * n + write[..., None] * k
    q = q * q.shape[-1] ** -0.5
    numerator = (q.unsqueeze(-2) @ C).squeeze(-2)  # (B, H, Dv)
    denominator = (q * n).sum(-1)
    h = numerator / (torch.maximum(denominator.abs(), torch.exp(-m_new)) + eps).unsqueeze(-1)
    return h, (C, n, m_new)


def chunk(q, k, v, i, f, state: State, eps: float) -> tuple[torch.Tensor, State]:
    """L tokens at once: q, k (B, H, L, Dk), v (B, H, L, Dv), i, f (B, H, L) -> h (B, H, L, Dv), state after the
    last. A token with i = -inf and f = +inf (log sigmoid 0) leaves the state as it is: that is padding."""
    C, n, m = state
    length = q.shape[-2]
    b = F.logsigmoid(f).cumsum(-1)  # (B, H, L) log of the forget gates' product up to each token
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    # log weight of token s in the memory after token t (s <= t), and of the saved state
    log_w = (b.unsqueeze(-1) - b.unsqueeze(-2) + i.unsqueeze(-2)).masked_fill(~causal, float("-inf"))  # (B,H,L,L)
    log_w_state = b + m.unsqueeze(-1)  # (B, H, L)
    m_all = torch.maximum(log_w_state, log_w.amax(-1))  # every token's stabiliser, as `step` would have it
    w = torch.exp(log_w - m_all.unsqueeze(-1))
    w_state = torch.exp(log_w_state - m_all)
    q = q * q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-2, -1)) * w  # (B, H, L, L)
    numerator = w_state.unsqueeze(-1) * (q @ C) + scores @ v
    denominator = w_state * (q @ n.unsqueeze(-1)).squeeze(-1) + scores.sum(-1)
    h = numerator / (torch.maximum(denominator.abs(), torch.exp(-m_all)) + eps).unsqueeze(-1)
    # The state after the last token: the last row of the weights.
    k_last = k * w[..., -1, :].unsqueeze(-1)  # (B, H, L, Dk)
    keep = w_state[..., -1]
    C = keep[..., None, None] * C + k_last.transpose(-2, -1) @ v
    n = keep[..., None] * n + k_last.sum(-2)
    return h, (C, n, m_all[..., -1])


def sequence(q, k, v, i, f, state: State, eps: float, chunk_size: int) -> tuple[torch.Tensor, State]:
    """Any number of tokens (the shapes of `chunk`), `chunk_size` at a time: the (L, L) weights stay small."""
    if q.shape[-2] == 1:
        h, state = step(q[..., 0, :], k[..., 0, :], v[..., 0, :], i[..., 0], f[..., 0], state, eps)
        return h.unsqueeze(-2), state
    outputs = []
    for start in range(0, q.shape[-2], chunk_size):
        piece = slice(start, start + chunk_size)
        h, state = chunk(q[..., piece, :], k[..., piece, :], v[..., piece, :], i[..., piece], f[..., piece],
                         state, eps)
        outputs.append(h)
    return torch.cat(outputs, dim=-2), state
