"""The chunked SSD scan against the token-by-token recurrence, in float32."""

from __future__ import annotations

import pytest
import torch

from quill.models.families.ssd import ssd_chunked, ssd_step


def inputs(t: int, heads: int = 6, groups: int = 3, head_dim: int = 4, d_state: int = 5, batch: int = 2,
           decay: float = 4.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        x=torch.randn(batch, t, heads, head_dim, generator=g), dt=torch.rand(batch, t, heads, generator=g) * 0.5,
        A=-torch.rand(heads, generator=g) * decay, B=torch.randn(batch, t, groups, d_state, generator=g),
        C=torch.randn(batch, t, groups, d_state, generator=g),
        state=torch.randn(batch, heads, head_dim, d_state, generator=g),
    )


def token_by_token(x, dt, A, B, C, state):
    ys = []
    for i in range(x.shape[1]):
        y, state = ssd_step(x[:, i], dt[:, i], A, B[:, i], C[:, i], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 37, 64])
def test_chunked_scan_equals_the_recurrence(chunk_size):
    v = inputs(37)
    want_y, want_state = token_by_token(**v)
    y, state = ssd_chunked(**v, chunk_size=chunk_size)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)


def test_long_chunks_with_slow_and_fast_decays_stay_exact():
    """Chunks of 256 tokens whose summed log-decays reach the hundreds: no cancellation between cumsums."""
    v = inputs(300, heads=4, groups=1, decay=8.0, batch=1, seed=1)
    v["A"][0] = -1e-3  # one head that hardly forgets
    want_y, want_state = token_by_token(**v)
    y, state = ssd_chunked(**v, chunk_size=256)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)


def test_tokens_with_zero_dt_leave_the_state_alone():
    v = inputs(9)
    v["dt"][:, 5:] = 0
    _, want = ssd_chunked(**{**v, **{k: v[k][:, :5] for k in ("x", "dt", "B", "C")}}, chunk_size=4)
    _, state = ssd_chunked(**v, chunk_size=4)
    torch.testing.assert_close(state, want, rtol=1e-6, atol=1e-6)
