"""Every query tile size of the Triton attention kernel is launched once before serving (compiled then on CUDA)."""

from __future__ import annotations

import pytest

from quill.server.engine.warmup import QUERY_LENS, warm_attention_variants
from tests.conftest import KERNEL_DEVICE, build_tiny_model

pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_one_step_per_tile_size_reaches_the_kernel(key, monkeypatch):
    from quill.models.attention import triton_kernel

    _, model = build_tiny_model(key, 300, device=KERNEL_DEVICE)  # compiled on a GPU, interpreted on a CPU
    model.attention_backend = "triton"
    tiles = []
    real = triton_kernel.paged_attention
    monkeypatch.setattr(triton_kernel, "paged_attention",
                        lambda *args, **kwargs: tiles.append(args[8]) or real(*args, **kwargs))
    assert warm_attention_variants(model, 4) == list(QUERY_LENS)
    assert sorted(set(tiles)) == [1, 2, 4, 8, 16]  # block_q of every variant, each layer's launch alike


def test_models_that_do_not_attend_through_triton_warm_nothing():
    _, lstm = build_tiny_model("lstm", 300, device="cpu")
    _, sdpa = build_tiny_model("transformer-llama", 300, device="cpu")
    assert warm_attention_variants(lstm, 4) == [] and warm_attention_variants(sdpa, 4) == []
