"""The CPU attention backend: its decode kernel reads the cache blocks in place and equals SDPA over gathered
blocks, in decode-only and mixed steps, with grouped-query heads, and whatever the blocks' order."""

from __future__ import annotations

import copy
import pytest
import torch

from quill.models.attention import select_attention_backend
from quill.models.attention.cpu_backend import CpuPagedAttention
from quill.models.attention.cpu_kernel import kernel
from quill.models.batch import StepBatch
from tests.conftest import build_tiny_model, needs_cxx, torch_threads

pytestmark = needs_cxx

V = 300


def test_the_kernel_builds_where_there_is_a_compiler():
    built = kernel()  # built before the first test, beside the other CPU kernels (tests/conftest.py)
    assert not isinstance(built, str), f"the CPU attention kernel {built}"


# (K,V heads, sequences, threads): one work item per sequence, or each sequence's heads in shares (even, uneven, and
# fewer than asked for where an even split would leave one empty: 6 heads, 4 wanted, 3 of 2)
@pytest.mark.parametrize("kv_heads,num_seqs,threads",
                         [(2, 3, 1), (3, 3, 1), (3, 2, 2), (6, 2, 2), (2, 20, 2), (1, 5, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [16, 24, 64, 128])  # AVX-512 paths: dots at multiples of 16; 64, 128 16 heads at a time
@pytest.mark.parametrize("heads", [6, 24])  # 24: an item of more than 16 heads
def test_the_kernel_equals_softmax_attention_over_its_blocks(kv_heads, num_seqs, threads, dtype, dim, heads):
    """bfloat16 caches are widened as they are read: the float32 arithmetic over their values, rounded once."""
    g = torch.Generator().manual_seed(0)
    block, width = 4, 4
    num_blocks = num_seqs * width
    k_cache, v_cache = (torch.randn(num_blocks, block, kv_heads, dim, generator=g).to(dtype) for _ in range(2))
    tables = torch.randperm(num_blocks, generator=g).view(num_seqs, width)
    lengths = torch.randint(1, block * width + 1, (num_seqs,), generator=g)
    lengths[0] = 1
    q = torch.randn(num_seqs, heads, dim, generator=g).to(dtype)
    with torch_threads(threads):
        out = kernel().paged_decode_attention(q, k_cache, v_cache, tables, lengths, dim ** -0.5)
    assert out.dtype == dtype
    q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    for b in range(num_seqs):
        n = int(lengths[b])
        keys = k_cache[tables[b]].flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, 1)  # (n, heads, dim)
        values = v_cache[tables[b]].flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, 1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[b], keys) * dim ** -0.5, -1)
        expected = torch.einsum("hn,nhd->hd", weights, values).to(dtype)
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 8e-3)


def test_auto_picks_it_on_the_cpu():
    assert select_attention_backend("auto", "cpu").name == "cpu"


# prompts; decodes around a chunk; decodes only
STEPS = [([5, 3, 9, 2], [0, 0, 0, 0]), ([1, 6, 1, 1], [5, 3, 9, 2]), ([1, 1, 1, 1], [6, 9, 10, 3])]
TABLES = [[3, 17, 8, 30, 21, 0], [12, 5, 26, 1, 2, 4], [9, 33, 2, 14, 27, 6], [19, 24, 11, 35, 36, 37]]


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_steps_through_it_equal_steps_through_sdpa(key):
    _, model = build_tiny_model(key, V, device="cpu")
    states = {name: model.new_state(40, block_size=4, attention_backend=name) for name in ("cpu", "sdpa")}
    g = torch.Generator().manual_seed(0)
    for counts, starts in STEPS:
        new = [torch.randint(0, V, (n,), generator=g).tolist() for n in counts]
        batch = StepBatch.build(new, starts, block_tables=TABLES, logits="all")
        logits = {name: model.step(batch, state) for name, state in states.items()}
        torch.testing.assert_close(logits["cpu"], logits["sdpa"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_bfloat16_steps_through_it_are_as_close_to_float32_as_sdpas(key):
    """In bfloat16 the two paths round differently, and the differences grow through the layers: each is held to
    its distance from the float32 model's logits instead."""
    _, reference = build_tiny_model(key, V, device="cpu")
    model = copy.deepcopy(reference).to(torch.bfloat16)
    states = {name: model.new_state(40, block_size=4, attention_backend=name) for name in ("cpu", "sdpa")}
    exact = reference.new_state(40, block_size=4, attention_backend="sdpa")
    g = torch.Generator().manual_seed(0)
    for counts, starts in STEPS:
        new = [torch.randint(0, V, (n,), generator=g).tolist() for n in counts]
        batch = StepBatch.build(new, starts, block_tables=TABLES, logits="all")
        expected = reference.step(batch, exact)
        error = {name: (model.step(batch, state).float() - expected).abs().mean() for name, state in states.items()}
        assert error["cpu"] <= 1.15 * error["sdpa"], error
        assert error["sdpa"] < 0.02 * expected.abs().mean()  # bfloat16's rounding, not a wrong answer


def test_a_prompts_first_chunk_reads_no_cache_and_a_later_one_reads_only_its_own_blocks():
    # a first chunk of 5 (positions 0-4), decodes at 3 and 9, a later chunk at 3-8; tables of 6 blocks of 4
    batch = StepBatch.build([[1] * 5, [1], [1], [1] * 6], [0, 3, 9, 3], block_tables=TABLES)
    decodes, first, later = CpuPagedAttention.build(batch, 4).parts
    assert (decodes.num_seqs, decodes.fresh, decodes.width) == (2, False, 24)
    assert first.fresh
    assert not later.fresh and later.width == 12 and later.block_tables.tolist() == [TABLES[3][:3]]
