"""The state families' decode step (one token per sequence) as Triton kernels that update each sequence's
state where it lies, in its slot of the model's state tensor.

Eager PyTorch gathers the step's slots into a copy, updates the copy in four to ten elementwise kernels (each a
full pass over the state, in float32) and scatters it back: at 256 sequences of a 1.3B Mamba-2 that is some ten
passes over 26 GB of state per step, 117 ms on an H200, where reading and writing it once takes about 12 ms.
These kernels read each sequence's state once and write it once, with the same float32 arithmetic as the eager steps they replace:
- `mamba_step_`: Mamba-1 (quill/models/families/mamba_scan.py `scan_step`): a decay per channel and state index; and
  `mamba_scan_`, its prefill: many tokens per row, the state in registers throughout;
- `ssd_step_`: Mamba-2 (quill/models/families/ssd.py `ssd_step`): a decay per head, B and C shared by a group of heads;
- `mlstm_step_`: xLSTM's mLSTM (quill/models/families/mlstm.py `step`): the matrix memory C updated in place; n and m, small,
  come back as new tensors for the caller to store (every program of a head reads the old ones).

The slots are a device tensor and nothing is read back to the host, so the steps can be captured in CUDA graphs.
Two rows must not share a slot (the engine never gives them the same one; graph padding rows have a spare).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _contiguous_f32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float().contiguous() for t in tensors]


@triton.jit
def _mamba_scan(state_ptr, slots_ptr, u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, y_ptr,
                stride_slot, stride_d, d_inner, num_tokens,
                N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_ok, n_ok = d < d_inner, n < N
    both = d_ok[:, None] & n_ok[None, :]
    slot = tl.load(slots_ptr + row).to(tl.int64)
    at = state_ptr + slot * stride_slot + d[:, None] * stride_d + n[None, :]
    s = tl.load(at, mask=both, other=0.0)
    a = tl.load(a_ptr + d[:, None] * N + n[None, :], mask=both, other=0.0)
    for t in range(num_tokens):  # the state stays in registers from the first token to the last
        token = row * num_tokens + t
        dt = tl.load(dt_ptr + token * d_inner + d, mask=d_ok, other=0.0)
        u = tl.load(u_ptr + token * d_inner + d, mask=d_ok, other=0.0)
        b = tl.load(b_ptr + token * N + n, mask=n_ok, other=0.0)
        c = tl.load(c_ptr + token * N + n, mask=n_ok, other=0.0)
        s = tl.exp(dt[:, None] * a) * s + (dt * u)[:, None] * b[None, :]
        tl.store(y_ptr + token * d_inner + d, tl.sum(s * c[None, :], axis=1), mask=d_ok)
    tl.store(at, s, mask=both)


def mamba_scan_(state: torch.Tensor, slots: torch.Tensor, u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Mamba-1's scan over Q tokens per row from the state in its slot: u, dt (R, Q, d); A (d, N); B, C (R, Q, N)
    -> y (R, Q, d); the state after the last token written into the slot. A token with dt 0 (padding) leaves the
    state as it was. Each program keeps its channels' state in registers for the whole scan: one read and one
    write of the state, where quill/models/families/mamba_scan.py's chunked scan makes some 2 sqrt(Q) rounds of eager kernels."""
    rows, num_tokens, d_inner = u.shape
    N = A.shape[-1]
    if state.stride(-1) != 1 or state.dtype != torch.float32:
        raise ValueError("the state must be float32 with a contiguous last dimension")
    u, dt, A, B, C = _contiguous_f32(u, dt, A, B, C)
    y = torch.empty_like(u)
    block_n = triton.next_power_of_2(N)
    if num_tokens == 1:  # a decode step: wide blocks, as the state is read once and written once anyway
        block_d, warps = max(16, min(128, 4096 // block_n)), 4
    else:  # a prefill: narrow blocks, so that many programs run their sequential loops side by side
        block_d, warps = max(16, min(64, 1024 // block_n)), 2
    _mamba_scan[(rows, triton.cdiv(d_inner, block_d))](
        state, slots, u, dt, A, B, C, y, state.stride(0), state.stride(1), d_inner, num_tokens,
        N=N, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=warps)
    return y


def mamba_step_(state: torch.Tensor, slots: torch.Tensor, u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """One token per row: u, dt (R, d); B, C (R, N) -> y (R, d) = C . s for each row's new state
    s = exp(dt A) * s + dt u B, written into its slot (`mamba_scan_` over one token)."""
    return mamba_scan_(state, slots, u[:, None], dt[:, None], A, B[:, None], C[:, None])[:, 0]


# Mamba-1's decode convolution has no kernel here (the CPU's module has one): the model convolves eagerly on CUDA.
conv_step_ = None


@triton.jit
def _ssd_step(state_ptr, slots_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, y_ptr,
              stride_slot, stride_head, stride_p, heads, heads_per_group, groups,
              P: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    p_ok, n_ok = p < P, n < N
    both = p_ok[:, None] & n_ok[None, :]
    g = h // heads_per_group
    slot = tl.load(slots_ptr + row).to(tl.int64)
    at = state_ptr + slot * stride_slot + h * stride_head + p[:, None] * stride_p + n[None, :]
    s = tl.load(at, mask=both, other=0.0)
    dt = tl.load(dt_ptr + row * heads + h)
    a = tl.load(a_ptr + h)
    x = tl.load(x_ptr + (row * heads + h) * P + p, mask=p_ok, other=0.0)
    b = tl.load(b_ptr + (row * groups + g) * N + n, mask=n_ok, other=0.0)
    c = tl.load(c_ptr + (row * groups + g) * N + n, mask=n_ok, other=0.0)
    s = s * tl.exp(dt * a) + (dt * x)[:, None] * b[None, :]
    tl.store(at, s, mask=both)
    tl.store(y_ptr + (row * heads + h) * P + p, tl.sum(s * c[None, :], axis=1), mask=p_ok)


def ssd_step_(state: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
              B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """state (S, h, p, n) float32, one layer's slots; slots (R,); x (R, h, p); dt (R, h); A (h,); B, C (R, g, n)
    -> y (R, h, p) = S C for each row's new state S = exp(dt A) S + dt x B^T, written into its slot."""
    rows, heads, P = x.shape
    groups, N = B.shape[1:]
    if state.stride(-1) != 1 or state.dtype != torch.float32:
        raise ValueError("the state must be float32 with a contiguous last dimension")
    x, dt, A, B, C = _contiguous_f32(x, dt, A, B, C)
    y = torch.empty_like(x)
    block_n = triton.next_power_of_2(N)
    block_p = max(1, min(triton.next_power_of_2(P), 4096 // block_n))
    _ssd_step[(rows, heads, triton.cdiv(P, block_p))](
        state, slots, x, dt, A, B, C, y, state.stride(0), state.stride(1), state.stride(2),
        heads, heads // groups, groups, P=P, N=N, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4)
    return y


@triton.jit
def _mlstm_step(c_ptr, n_ptr, m_ptr, slots_ptr, q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, h_ptr, n_out_ptr, m_out_ptr,
                c_slot, c_head, c_k, n_slot, n_head, m_slot, heads, dk, dv, eps, scale,
                BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    vblock = tl.program_id(2)
    cols = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
    cols_ok = cols < dv
    slot = tl.load(slots_ptr + row).to(tl.int64)
    rh = row * heads + head
    # the gates: log sigmoid(f) = min(f, 0) - log(1 + exp(-|f|))
    f = tl.load(f_ptr + rh)
    i = tl.load(i_ptr + rh)
    m = tl.load(m_ptr + slot * m_slot + head)
    log_f = tl.minimum(f, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(f)))
    m_new = tl.maximum(log_f + m, i)
    keep = tl.exp(log_f + m - m_new)
    write = tl.exp(i - m_new)
    v = tl.load(v_ptr + rh * dv + cols, mask=cols_ok, other=0.0)
    numerator = tl.zeros([BLOCK_V], dtype=tl.float32)
    denominator = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in range(0, dk, BLOCK_K):
        rows_k = start + tl.arange(0, BLOCK_K)
        k_ok = rows_k < dk
        both = k_ok[:, None] & cols_ok[None, :]
        k = tl.load(k_ptr + rh * dk + rows_k, mask=k_ok, other=0.0)
        q = tl.load(q_ptr + rh * dk + rows_k, mask=k_ok, other=0.0) * scale
        at = c_ptr + slot * c_slot + head * c_head + rows_k[:, None] * c_k + cols[None, :]
        memory = keep * tl.load(at, mask=both, other=0.0) + (write * k)[:, None] * v[None, :]
        tl.store(at, memory, mask=both)
        numerator += tl.sum(q[:, None] * memory, axis=0)
        n = keep * tl.load(n_ptr + slot * n_slot + head * n_head + rows_k, mask=k_ok, other=0.0) + write * k
        denominator += q * n
        if vblock == 0:
            tl.store(n_out_ptr + rh * dk + rows_k, n, mask=k_ok)
    if vblock == 0:
        tl.store(m_out_ptr + rh, m_new)
    scale_h = tl.maximum(tl.abs(tl.sum(denominator, axis=0)), tl.exp(-m_new)) + eps
    tl.store(h_ptr + rh * dv + cols, numerator / scale_h, mask=cols_ok)


def mlstm_step_(C: torch.Tensor, n: torch.Tensor, m: torch.Tensor, slots: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's state C (S, H, Dk, Dv), n (S, H, Dk), m (S, H), float32 (views are fine); slots (R,);
    q, k (R, H, Dk), v (R, H, Dv), i, f (R, H) pre-activations -> (h (R, H, Dv), new n (R, H, Dk), new m (R, H)).
    C is updated in its slots; n and m are the caller's to store."""
    rows, heads, dk = q.shape
    dv = v.shape[-1]
    if any(t.stride(-1) != 1 or t.dtype != torch.float32 for t in (C, n)) or m.dtype != torch.float32:
        raise ValueError("the state must be float32 with contiguous last dimensions")
    q, k, v, i, f = _contiguous_f32(q, k, v, i, f)
    h = torch.empty_like(v)
    n_out, m_out = torch.empty_like(q), torch.empty_like(i)
    block_v = min(triton.next_power_of_2(dv), 64)
    block_k = min(triton.next_power_of_2(dk), 64)
    _mlstm_step[(rows, heads, triton.cdiv(dv, block_v))](
        C, n, m, slots, q, k, v, i, f, h, n_out, m_out,
        C.stride(0), C.stride(1), C.stride(2), n.stride(0), n.stride(1), m.stride(0),
        heads, dk, dv, eps, dk ** -0.5, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=4)
    return h, n_out, m_out
