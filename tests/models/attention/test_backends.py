"""Attention backends: the registry's choices, and whole Transformer steps equal through every backend."""

from __future__ import annotations

import pytest
import torch

from quill.models.attention import ATTENTION_BACKENDS, select_attention_backend
from quill.models.attention.sdpa import SdpaPagedAttention
from quill.models.batch import StepBatch
from tests.conftest import KERNEL_DEVICE, build_tiny_model

V = 300


def test_auto_is_the_cpu_kernel_on_the_cpu_where_it_builds_and_caches_carry_their_backend(monkeypatch):
    from quill.models.attention import cpu_backend

    expected = "sdpa" if isinstance(cpu_backend.kernel(), str) else "cpu"
    assert select_attention_backend("auto", "cpu").name == expected
    _, model = build_tiny_model("transformer-llama", V, device="cpu")
    assert model.new_state(4, block_size=4).attention.name == expected
    model.attention_backend = "sdpa"
    assert model.new_state(4, block_size=4).attention is SdpaPagedAttention
    monkeypatch.setattr(cpu_backend, "kernel", lambda: "did not build (no compiler)")  # where it cannot build
    assert select_attention_backend("auto", "cpu") is SdpaPagedAttention
    with pytest.raises(ValueError, match="needs its C.. kernel, which did not build"):
        select_attention_backend("cpu", "cpu")


def test_load_checkpoint_chooses_the_backend(tmp_path, tiny_tokenizer):
    from quill.models.loading.checkpoint import load_checkpoint, save_checkpoint

    arch, model = build_tiny_model("transformer-llama", tiny_tokenizer.vocab_size, device="cpu")
    path = save_checkpoint(tmp_path, arch, model, tiny_tokenizer, dtype=torch.float32)
    assert load_checkpoint(path, device="cpu", attention_backend="sdpa").model.attention_backend == "sdpa"
    assert load_checkpoint(path, device="cpu").model.attention_backend == select_attention_backend("auto", "cpu").name
    with pytest.raises(ValueError, match="not 'flash'"):
        load_checkpoint(path, device="cpu", attention_backend="flash")


def test_unknown_backend_is_refused_with_the_names_it_knows():
    with pytest.raises(ValueError, match="auto or one of sdpa, triton"):
        select_attention_backend("flash", "cpu")


def test_triton_is_refused_on_the_cpu_outside_the_interpreter(monkeypatch):
    pytest.importorskip("triton", reason="needs the triton package")
    from quill.models.attention import triton_kernel

    monkeypatch.setattr(triton_kernel, "is_interpreted", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        select_attention_backend("triton", "cpu")


# Two steps over four sequences: prompts (some over several blocks), then a prompt chunk after a block
# boundary among decodes. (Decode-only steps and the kernel's corners: test_triton_kernel.py.)
STEPS = [
    ([0, 1, 2, 3], [7, 1, 5, 2]),
    ([0, 1, 2, 3], [1, 1, 6, 1]),
]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}
# Llama (grouped-query heads, RoPE) in every dtype the kernel device runs; GPT-2 (learned positions,
# biases) in float32. Few cases: on the CPU each launch runs in the interpreter.
CASES = [("transformer-llama", torch.float32), ("transformer-llama", torch.float16),
         ("transformer-gpt2", torch.float32)]
if KERNEL_DEVICE.type == "cuda":
    CASES += [("transformer-llama", torch.bfloat16), ("transformer-gpt2", torch.bfloat16)]


@pytest.mark.parametrize(("key", "dtype"), CASES, ids=lambda x: str(x).removeprefix("torch."))
def test_transformer_steps_through_triton_equal_sdpa(key, dtype):
    pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")
    _, model = build_tiny_model(key, V, device=KERNEL_DEVICE)
    model.to(dtype)
    block_size = 4
    states = {name: model.new_state(40, block_size=block_size, attention_backend=name)
              for name, backend in ATTENTION_BACKENDS.items() if backend.unavailable_reason(KERNEL_DEVICE) is None}
    assert states["triton"].attention.name == "triton"
    tables = [[3, 17, 8, 30, 21], [12, 5, 26, 1], [9, 33, 2, 14, 27, 6], [19, 24, 11]]  # scattered blocks
    g = torch.Generator().manual_seed(0)
    lengths = [0, 0, 0, 0]
    for seqs, counts in STEPS:
        new = [torch.randint(0, V, (n,), generator=g).tolist() for n in counts]
        batch = StepBatch.build(new, [lengths[i] for i in seqs], block_tables=[tables[i] for i in seqs],
                                logits="all", device=KERNEL_DEVICE)
        logits = {name: model.step(batch, state) for name, state in states.items()}
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(logits["triton"], logits["sdpa"], atol=tol, rtol=tol)
        for i, n in zip(seqs, counts):
            lengths[i] += n
