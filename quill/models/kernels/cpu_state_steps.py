"""The state families' steps on the CPU (cpu_state_steps.cpp): the same calls as the GPU's Triton kernels
(state_steps.py), updating each sequence's state where it lies in its slot.

The eager steps gather the step's slots into a copy, update it in four to ten elementwise passes and scatter it
back; for 64 sequences of a 125M-class xLSTM that is about 19 MB of memory C per block and pass. These read
each slot once and write it once. Mamba-1's prompts run through the same scan, each (sequence, channel) keeping its
states in registers from the first token to the last, where the eager scan makes a round of kernels per token.
`steps()` is the module, or why it could not be built (quill/models/kernels/cpu_build.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .cpu_build import build

SOURCE = Path(__file__).with_name("cpu_state_steps.cpp")


@functools.cache
def steps():
    """The compiled kernels, or the reason they could not be built (a string)."""
    return build(SOURCE, "the CPU state-step kernels")


def _check(*states: torch.Tensor) -> None:
    if any(t.dtype != torch.float32 for t in states) or any(t.stride(-1) != 1 for t in states[:2]):
        raise ValueError("the state must be float32 with a contiguous last dimension")


def mamba_scan_(state: torch.Tensor, slots: torch.Tensor, u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Mamba-1's scan over Q tokens per row from the state in its slot: u, dt (R, Q, d); A (d, N); B, C (R, Q, N)
    -> y (R, Q, d); the state after the last token written into the slot. A token with dt 0 (padding) leaves the
    state as it was."""
    _check(state)
    return steps().mamba_scan(state, slots, u, dt, A, B, C)


def mamba_step_(state: torch.Tensor, slots: torch.Tensor, u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """One token per row: u, dt (R, d); B, C (R, N) -> y (R, d), the new states written into the slots."""
    return mamba_scan_(state, slots, u[:, None], dt[:, None], A, B[:, None], C[:, None])[:, 0]


def conv_step_(window: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    """Mamba-1's depthwise causal convolution and its SiLU for one token per row: window (S, d, K - 1), a
    layer's view of every slot, oldest input first; x (R, d); weight (d, K); bias (d,) or None -> (R, d). Each
    row's window slides in place, x its newest input. (The CPU's alone: on CUDA the eager path serves.)"""
    _check(window)
    return steps().conv_step(window, slots, x, weight, torch.empty(0) if bias is None else bias)


def ssd_step_(state: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
              B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """state (S, h, p, n) float32, one layer's slots; slots (R,); x (R, h, p); dt (R, h); A (h,); B, C (R, g, n)
    -> y (R, h, p) = S C for each row's new state S = exp(dt A) S + dt x B^T, written into its slot."""
    _check(state)
    return steps().ssd_step(state, slots, x, dt, A, B, C)


def mlstm_step_(C: torch.Tensor, n: torch.Tensor, m: torch.Tensor, slots: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's state C (S, H, Dk, Dv), n (S, H, Dk), m (S, H), float32; slots (R,); q, k (R, H, Dk),
    v (R, H, Dv), i, f (R, H) pre-activations -> (h (R, H, Dv), new n (R, H, Dk), new m (R, H)). C is updated in
    its slots; n and m are the caller's to store."""
    _check(C, n, m)
    h, n_new, m_new = steps().mlstm_step(C, n, m, slots, q, k, v, i, f, eps)
    return h, n_new, m_new
