"""The Triton paged-attention kernel against the SDPA reference path.

Each step mixes prefill chunks (from position 0 and after cached context) with single decode tokens
in one launch, over sequences whose blocks are scattered through the cache and whose block tables are
padded to the widest. The kernel's cache holds NaN wherever nothing was written (the padding block
included), so reading any slot it should not turns its output into NaN. On the CPU the kernel runs in
the Triton interpreter, in float32 and float16 (the interpreter has no bfloat16 dots); on a GPU it is
compiled, and bfloat16 is tested too.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")

from quill.models.attention.sdpa import SdpaPagedAttention  # noqa: E402
from quill.models.attention.triton_backend import TritonPagedAttention  # noqa: E402
from quill.models.batch import StepBatch  # noqa: E402
from tests.conftest import KERNEL_DEVICE  # noqa: E402

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if KERNEL_DEVICE.type == "cuda" else [])
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}

# (cached tokens, new tokens) per sequence: a whole prompt over two blocks of 16, a decode at position 37,
# a prompt chunk after 5 cached tokens, a decode 4 blocks in, a decode on a block boundary, a one-token
# prompt, and a chunk crossing a block boundary that needs two query tiles.
MIXED = [(0, 20), (37, 1), (5, 9), (50, 1), (16, 1), (0, 1), (31, 17)]
DECODES = [(0, 1), (12, 1), (33, 1), (47, 1), (3, 1)]


def run_step(specs, block_size, n_heads, n_kv_heads, head_dim, dtype, seed=0):
    """Both backends over one step; returns (kernel output, reference output, kernel cache, reference cache)."""
    g = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-(cached + new) // block_size) for cached, new in specs]
    # Block 0 is never handed out: StepBatch pads block tables with it.
    pool = (torch.randperm(sum(blocks_needed) + 5, generator=g) + 1).tolist()
    tables, taken = [], 0
    for n in blocks_needed:
        tables.append(pool[taken : taken + n])
        taken += n
    num_blocks = max(pool) + 1
    batch = StepBatch.build([[1] * new for _, new in specs], [cached for cached, _ in specs],
                            block_tables=tables, device=KERNEL_DEVICE)
    shape = (num_blocks, block_size, n_kv_heads, head_dim)
    reference_k, reference_v = torch.zeros(shape), torch.zeros(shape)
    for (cached, _), table in zip(specs, tables):  # the context earlier steps cached
        for pos in range(cached):
            reference_k[table[pos // block_size], pos % block_size] = torch.randn(n_kv_heads, head_dim, generator=g)
            reference_v[table[pos // block_size], pos % block_size] = torch.randn(n_kv_heads, head_dim, generator=g)
    written = reference_k.abs().sum((-1, -2)) > 0  # (num_blocks, block_size)
    T = batch.num_tokens
    q = torch.randn(T, n_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(T, n_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(T, n_kv_heads, head_dim, generator=g).to(dtype)
    reference_k, reference_v = reference_k.to(dtype), reference_v.to(dtype)
    kernel_k = torch.where(written[..., None, None], reference_k, float("nan")).to(KERNEL_DEVICE)
    kernel_v = torch.where(written[..., None, None], reference_v, float("nan")).to(KERNEL_DEVICE)
    on = dict(device=KERNEL_DEVICE)
    # The reference runs in float32 from the same (rounded) inputs.
    reference_k, reference_v = reference_k.float().to(**on), reference_v.float().to(**on)
    expected = SdpaPagedAttention.build(batch, block_size).forward(
        q.float().to(**on), k.float().to(**on), v.float().to(**on), reference_k, reference_v)
    got = TritonPagedAttention.build(batch, block_size).forward(q.to(**on), k.to(**on), v.to(**on), kernel_k, kernel_v)
    return got, expected, (kernel_k, kernel_v), (reference_k, reference_v)


def assert_matches(got, expected, dtype):
    assert got.dtype == dtype and not got.isnan().any()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mixed_prefill_chunks_and_decodes_with_grouped_heads(dtype, block_size):
    got, expected, kernel_cache, reference_cache = run_step(MIXED, block_size, 4, 2, 8, dtype)
    assert got.shape == (sum(new for _, new in MIXED), 4 * 8)
    assert_matches(got, expected, dtype)
    for mine, theirs in zip(kernel_cache, reference_cache):  # the new tokens' K,V landed in the same slots
        filled = ~mine.isnan()
        assert torch.equal(filled, theirs.abs().sum((-1, -2), keepdim=True).expand_as(theirs) > 0)
        assert torch.equal(mine[filled].float(), theirs[filled])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_only_step(dtype):
    got, expected, _, _ = run_step(DECODES, 16, 4, 2, 8, dtype, seed=1)
    assert_matches(got, expected, dtype)


@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), [(4, 4, 16), (6, 2, 24), (8, 1, 32)],
                         ids=["multi-head", "groups-of-3", "multi-query"])
def test_head_layouts(n_heads, n_kv_heads, head_dim):
    dtype = torch.bfloat16 if KERNEL_DEVICE.type == "cuda" else torch.float32
    got, expected, _, _ = run_step(MIXED[:4], 16, n_heads, n_kv_heads, head_dim, dtype, seed=2)
    assert_matches(got, expected, dtype)


def test_block_size_that_is_not_a_power_of_two():
    got, expected, _, _ = run_step(MIXED[:3], 5, 4, 2, 8, torch.float32, seed=3)
    assert_matches(got, expected, torch.float32)


@pytest.mark.parametrize("specs", [MIXED, MIXED[:2], MIXED[:3], [(0, 5)], DECODES[:3] + [(0, 2)]])
def test_every_packed_array_starts_on_16_bytes(specs):
    """Compiled Triton compiles a kernel again for each pointer alignment it meets: whatever the number of
    sequences and tiles, the offsets arrays it reads start aligned, so one variant per tile size serves all."""
    batch = StepBatch.build([[1] * new for _, new in specs], [cached for cached, _ in specs],
                            block_tables=[[1] * -(-(c + n) // 16) for c, n in specs], device=KERNEL_DEVICE)
    meta = TritonPagedAttention.build(batch, 16)
    for name in ("seq_starts", "tile_seqs", "tile_starts"):
        assert getattr(meta, name).data_ptr() % 16 == 0, name
    assert meta.seq_starts.tolist()[-1] == batch.num_tokens and len(meta.tile_seqs) == len(meta.tile_starts)
