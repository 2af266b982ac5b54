"""Each fused Triton kernel against the eager reference (quill/models/kernels/torch_ops.py).

Small odd shapes: widths that are not powers of two, one row and many, strided inputs as the model
hands them over (q and k are views into one projection). On the CPU the kernels run in the Triton
interpreter, in float32 and float16; on a GPU they are compiled, and bfloat16 is tested too. The
reference gets the same (rounded) inputs and runs in the kernel's dtype, so float32 agrees to
rounding and the 16-bit dtypes to an ulp or two.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")

from quill.models.kernels.torch_ops import TORCH_OPS  # noqa: E402
from quill.models.families.transformer import RMSNorm, UnitOffsetRMSNorm  # noqa: E402
from tests.conftest import KERNEL_DEVICE  # noqa: E402

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if KERNEL_DEVICE.type == "cuda" else [])
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # about 2 ulps for 16-bit


@pytest.fixture(scope="module")
def ops():
    from quill.models.kernels.triton_ops import TritonLayerOps

    return TritonLayerOps()


def randn(*shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(KERNEL_DEVICE)


def assert_close(got, expected, dtype):
    assert got.dtype == expected.dtype == dtype and got.shape == expected.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def make_norm(cls, dim, dtype, seed=1):
    norm = cls(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=torch.Generator().manual_seed(seed)))
    return norm.to(KERNEL_DEVICE, dtype)


@pytest.mark.parametrize("norm_cls", [RMSNorm, UnitOffsetRMSNorm], ids=lambda c: c.__name__)
@pytest.mark.parametrize(("rows", "dim"), [(1, 40), (7, 96), (33, 100)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_alone_and_fused_with_the_residual_add(ops, norm_cls, rows, dim, dtype):
    norm = make_norm(norm_cls, dim, dtype)
    x, residual = randn(rows, dim, dtype=dtype, seed=2), randn(rows, dim, dtype=dtype, seed=3, scale=4.0)
    assert_close(ops.norm(x, norm), TORCH_OPS.norm(x, norm), dtype)
    got_out, got_residual = ops.add_norm(x, residual, norm)
    expected_out, expected_residual = TORCH_OPS.add_norm(x, residual, norm)
    assert torch.equal(got_residual, expected_residual)  # one rounding of one sum: exact
    assert_close(got_out, expected_out, dtype)
    assert torch.equal(x, randn(rows, dim, dtype=dtype, seed=2))  # inputs left as they were


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_of_each_head_of_a_strided_view(ops, dtype):
    """Qwen3 normalises each head of q, a view into the packed projection (rows are not evenly strided)."""
    qkv = randn(5, 3 * 4 * 24, dtype=dtype)
    q = qkv[:, : 2 * 24].unflatten(-1, (2, 24))  # (T, H, hd) with row stride 3 * 4 * 24
    norm = make_norm(RMSNorm, 24, dtype)
    assert_close(ops.norm(q, norm), TORCH_OPS.norm(q, norm), dtype)


def rope_tables(num_tokens, head_dim, dtype):
    """Rotate-half tables (T, hd) as the model makes them: equal halves, at scattered positions."""
    positions = torch.tensor([0, 1, 7, 30, 129, 2000, 5, 3, 64][:num_tokens], dtype=torch.float32)
    freqs = positions[:, None] * 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype).to(KERNEL_DEVICE), emb.sin().to(dtype).to(KERNEL_DEVICE)


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"), [(1, 4, 2, 16), (9, 6, 2, 20), (3, 5, 5, 8)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_rotates_q_and_k_views_of_the_projection_in_one_launch(ops, tokens, heads, kv_heads, head_dim, dtype):
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k = q.unflatten(-1, (heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))
    cos, sin = rope_tables(tokens, head_dim, dtype)
    got_q, got_k = ops.rope(q, k, cos, sin)
    expected_q, expected_k = TORCH_OPS.rope(q, k, cos, sin)
    assert_close(got_q, expected_q, dtype)
    assert_close(got_k, expected_k, dtype)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize(("rows", "width"), [(1, 2 * 1100), (6, 2 * 37)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gated_activation(ops, activation, rows, width, dtype):
    """Widths over one program's block (1100 > 1024) and under it, on a non-contiguous batch of rows."""
    h = randn(rows, 2, width, dtype=dtype, scale=3.0)[:, 0]  # (rows, width), row stride 2 * width
    assert_close(ops.gated_act(h, activation), TORCH_OPS.gated_act(h, activation), dtype)


def test_what_the_kernels_do_not_cover_goes_to_the_reference(ops):
    """A LayerNorm (GPT-2), a norm whose weights' dtype is not its input's, and (B, T, H, hd) RoPE input."""
    layer_norm = torch.nn.LayerNorm(12).to(KERNEL_DEVICE)
    x = randn(3, 12, dtype=torch.float32)
    assert torch.equal(ops.norm(x, layer_norm), layer_norm(x))
    out, residual = ops.add_norm(x, x, layer_norm)
    assert torch.equal(residual, 2 * x) and torch.equal(out, layer_norm(2 * x))
    half = randn(3, 12, dtype=torch.float16)
    mixed = make_norm(RMSNorm, 12, torch.float32)
    assert torch.equal(ops.norm(half, mixed), TORCH_OPS.norm(half, mixed))
    q, k = randn(2, 3, 4, 8, dtype=torch.float32), randn(2, 3, 2, 8, dtype=torch.float32)
    cos, sin = rope_tables(3, 8, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(ops.rope(q, k, cos, sin), TORCH_OPS.rope(q, k, cos, sin)))
