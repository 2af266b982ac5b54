"""bfloat16 linear weights under float32 arithmetic (quill/models/kernels/narrow_weights.py): each product equals
float32's over the bfloat16-rounded weight, through both CPU layer ops and both of oneDNN's row ranges; a narrowed
model answers as a float32 model whose linear weights were rounded the same way; `--dtype bfloat16` narrows on a
CPU without bfloat16 arithmetic and nowhere else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quill.models.kernels import TORCH_OPS
from quill.models.kernels.narrow_weights import narrow_linear_weights, narrows_weights, widened
from quill.models.kernels.onednn_ops import OneDnnLayerOps, packed_max_rows
from quill.models.kernels.ops_linear import OpsLinear
from quill.models.loading.checkpoint import load_checkpoint
from tests.models.test_checkpoint import write_checkpoint

OPS = {"torch": TORCH_OPS, "onednn": OneDnnLayerOps()}


@pytest.mark.parametrize("ops", list(OPS))
@pytest.mark.parametrize("rows", [3, packed_max_rows() + 5])
def test_a_narrowed_product_is_float32_over_the_rounded_weight(ops, rows):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(rows, 48), torch.randn(40, 48).bfloat16(), torch.randn(40)
    expected = F.linear(x, weight.float(), bias)
    with torch.inference_mode():
        torch.testing.assert_close(OPS[ops].linear(x, weight, bias), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(OPS[ops].linear_act(x, weight, bias, "gelu"), F.gelu(expected), atol=1e-5, rtol=0)
    with torch.enable_grad():  # autograd gets a copy of its own, not the reused buffer
        x.requires_grad_(True)
        OPS[ops].linear(x, weight, bias).sum().backward()
        torch.testing.assert_close(x.grad, weight.float().sum(0).expand(rows, -1), atol=1e-5, rtol=0)


def test_widened_reuses_one_buffer_per_shape():
    a, b = torch.randn(4, 6).bfloat16(), torch.randn(4, 6).bfloat16()
    first = widened(a, torch.float32)
    assert torch.equal(first, a.float())
    second = widened(b, torch.float32)
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, b.float())
    assert widened(torch.randn(3, 6).bfloat16(), torch.float32).data_ptr() != first.data_ptr()


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2", "lstm", "lstm-untied", "gcnn"])
def test_a_narrowed_model_answers_as_float32_over_rounded_weights(tmp_path, key):
    write_checkpoint(tmp_path, key)
    narrowed = load_checkpoint(tmp_path, device="cpu", dtype="float32").model
    reference = load_checkpoint(tmp_path, device="cpu", dtype="float32").model
    count = narrow_linear_weights(narrowed)
    with torch.no_grad():  # the same weights rounded in float32: every linear one but those an embedding shares
        tables = {id(m.weight) for m in reference.modules() if isinstance(m, torch.nn.Embedding)}
        rounded = [m.weight for m in reference.modules() if isinstance(m, OpsLinear) and id(m.weight) not in tables]
        for weight in rounded:
            weight.copy_(weight.bfloat16().float())
    assert count == len(rounded) > 0
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(narrowed(tokens), reference(tokens), atol=1e-4, rtol=0)


def test_bfloat16_narrows_only_where_the_cpu_lacks_its_arithmetic(tmp_path):
    write_checkpoint(tmp_path)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="bfloat16")
    if narrows_weights(torch.device("cpu"), torch.bfloat16):
        assert (loaded.dtype, loaded.weights_dtype) == (torch.float32, torch.bfloat16)
    else:
        assert (loaded.dtype, loaded.weights_dtype) == (torch.bfloat16, None)
    assert not narrows_weights(torch.device("cpu"), torch.float32)
    assert not narrows_weights(torch.device("cuda"), torch.bfloat16)
