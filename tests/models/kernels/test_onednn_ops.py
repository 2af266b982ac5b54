"""The CPU's oneDNN layer ops: linear layers over weights packed once give F.linear's results, follow a weight
that changes, and leave what they cannot pack to F.linear; whole Transformer steps through them equal the
reference ops' steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quill.models.batch import StepBatch
from quill.models.kernels import TORCH_OPS, select_layer_ops
from quill.models.kernels.narrow_weights import cpu_has_bf16
from quill.models.kernels.onednn_ops import OneDnnLayerOps
from tests.conftest import build_tiny_model, torch_threads

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a PyTorch with oneDNN")


@pytest.fixture(autouse=True)
def two_threads():
    """The tests run on one thread, where (without AVX-512) only wide outputs go the packed way: these test that
    way at two."""
    with torch_threads(2):
        yield


@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24)])
def test_a_packed_linear_equals_f_linear(shape):
    ops = OneDnnLayerOps()
    weight, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(*shape)
    with torch.inference_mode():
        torch.testing.assert_close(ops.linear(x, weight, bias), F.linear(x, weight, bias))
        torch.testing.assert_close(ops.linear(x, weight, None), F.linear(x, weight))
        assert ops.is_packed(weight)


def test_a_weight_changed_in_place_or_replaced_is_packed_again():
    ops = OneDnnLayerOps()
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16)
    with torch.inference_mode():
        ops.linear(x, layer.weight, layer.bias)
        with torch.no_grad():
            layer.weight.mul_(2)
        torch.testing.assert_close(ops.linear(x, layer.weight, layer.bias), layer(x))
        layer.weight = torch.nn.Parameter(torch.randn(8, 16))
        torch.testing.assert_close(ops.linear(x, layer.weight, layer.bias), layer(x))


def test_training_and_other_dtypes_take_f_linear():
    ops = OneDnnLayerOps()
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)
    ops.linear(x, layer.weight, layer.bias).sum().backward()  # gradients flow: F.linear ran
    assert x.grad is not None and not ops.is_packed(layer.weight)
    with torch.inference_mode():
        half = torch.randn(3, 16, dtype=torch.float64)
        torch.testing.assert_close(ops.linear(half, layer.weight.double(), None), F.linear(half, layer.weight.double()))


def test_the_onednn_ops_run_on_the_cpu_only():
    assert OneDnnLayerOps.unavailable_reason(torch.device("cuda")) is not None
    assert select_layer_ops("onednn", "cpu").name == "onednn"


@pytest.mark.parametrize("key", ["transformer-llama", "transformer-gpt2"])
def test_transformer_steps_through_onednn_equal_the_reference(key):
    _, model = build_tiny_model(key, 300, device="cpu")
    tables = [[3, 7, 1], [5, 2, 8], [0, 4, 6]]
    states = {}
    for name, ops in (("torch", TORCH_OPS), ("onednn", select_layer_ops("onednn", "cpu"))):
        model.layer_ops = ops
        state = model.new_state(10, block_size=4)
        first = StepBatch.build([[5, 6, 7, 8, 9], [1, 2], [3]], [0, 0, 0], block_tables=tables, logits="all")
        then = StepBatch.build([[10], [11, 12, 13], [14]], [5, 2, 1], block_tables=tables, logits="all")
        states[name] = torch.cat([model.step(first, state), model.step(then, state)])
    torch.testing.assert_close(states["onednn"], states["torch"], atol=1e-4, rtol=1e-4)


def test_inputs_of_many_rows_keep_f_linear():
    from quill.models.kernels.onednn_ops import packed_max_rows

    limit = packed_max_rows()
    ops = OneDnnLayerOps()
    weight, x = torch.randn(8, 16), torch.randn(limit + 1, 16)
    with torch.inference_mode():
        torch.testing.assert_close(ops.linear(x, weight, None), F.linear(x, weight))
        assert not ops.is_packed(weight)
        ops.linear(x[:limit], weight, None)
        assert ops.is_packed(weight)


def test_float32_goes_the_packed_way_for_more_rows_with_avx512():
    """Past 128 rows the packed product is level or ahead with AVX-512 (a Xeon), behind without (an AVX2 EPYC)."""
    from quill.models.kernels import onednn_ops

    ops = OneDnnLayerOps()
    weight, x = torch.randn(8, 16), torch.randn(onednn_ops.PACKED_MAX_ROWS + 100, 16)
    with torch.inference_mode():
        torch.testing.assert_close(ops.linear(x, weight, None), F.linear(x, weight))
    assert ops.is_packed(weight) == onednn_ops._has_avx512()
    assert onednn_ops.PACKED_MAX_ROWS_AVX512 > onednn_ops.PACKED_MAX_ROWS


def test_bfloat16_inputs_go_the_packed_way_at_any_row_count():
    """Where oneDNN computes in bfloat16 its packed product beats F.linear at every row count: prompt chunks
    too, on one thread too; where it cannot (no AVX-512-BF16 or AMX) F.linear serves. Either way the answer is
    F.linear's but for bfloat16's rounding of the accumulated sums."""
    from quill.models.kernels.onednn_ops import packed_max_rows

    ops = OneDnnLayerOps()
    weight, x = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(2 * packed_max_rows(), 32, dtype=torch.bfloat16)
    with torch.inference_mode(), torch_threads(1):
        out = ops.linear(x, weight, None)
        assert ops.is_packed(weight) == cpu_has_bf16() and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float()), atol=0.1, rtol=0.02)


def test_wide_output_layers_go_the_packed_way_for_more_rows():
    """A vocabulary-wide output layer (oneDNN stays ahead there up to a decode step of beams): packed up to
    WIDE_MAX_ROWS rows (or the float32 limit where that is higher), F.linear past them."""
    from quill.models.kernels.onednn_ops import PACKED_MAX_ROWS, WIDE_MAX_ROWS, WIDE_OUTPUTS, packed_max_rows

    limit = packed_max_rows(wide=True)
    assert limit >= WIDE_MAX_ROWS
    ops = OneDnnLayerOps()
    wide, x = torch.randn(WIDE_OUTPUTS, 16), torch.randn(limit + 1, 16)
    assert WIDE_MAX_ROWS > PACKED_MAX_ROWS
    with torch.inference_mode():
        torch.testing.assert_close(ops.linear(x, wide, None), F.linear(x, wide), atol=1e-5, rtol=1e-5)
        assert not ops.is_packed(wide)
        torch.testing.assert_close(ops.linear(x[:limit], wide, None), F.linear(x[:limit], wide),
                                   atol=1e-5, rtol=1e-5)
        assert ops.is_packed(wide)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_an_activation_fused_into_the_product_equals_it_applied_after(activation):
    from quill.models.kernels.torch_ops import ACTIVATIONS

    ops = OneDnnLayerOps()
    weight, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(6, 24)
    with torch.inference_mode():
        fused = ops.linear_act(x, weight, bias, activation)
        assert ops.is_packed(weight)
        torch.testing.assert_close(fused, ACTIVATIONS[activation](F.linear(x, weight, bias)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key, called", [("lstm", ["proj"]), ("gcnn", ["in_proj", "out_proj"])])
def test_other_families_run_their_linear_modules_through_the_layer_ops(key, called, tmp_path, tiny_tokenizer):
    """load_checkpoint routes a family's own nn.Linear modules through the CPU's ops: the same parameter names and
    tensors, the weights packed once used, the same logits as the modules called directly."""
    from quill.models.kernels.ops_linear import OpsLinear
    from quill.models.loading.checkpoint import load_checkpoint
    from quill.models.loading.saving import save_checkpoint

    arch, reference = build_tiny_model(key, tiny_tokenizer.vocab_size, device="cpu")
    save_checkpoint(tmp_path, arch, reference, tiny_tokenizer, dtype=torch.float32)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32", layer_ops="onednn")
    linears = [m for m in loaded.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is OpsLinear for m in linears)
    assert set(loaded.model.state_dict()) == set(reference.state_dict())
    tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(tokens), reference(tokens), atol=1e-5, rtol=1e-5)
    ops = linears[0].ops
    assert ops.name == "onednn" and all(ops.is_packed(getattr(loaded.model, name).weight) for name in called)


def test_on_one_thread_narrow_layers_go_the_packed_way_only_with_avx512():
    """On one thread the packed product is ahead with AVX-512 and was behind F.linear for narrow layers on the AVX2
    CPU it was measured on: there only wide outputs go the packed way. The answer is F.linear's either way."""
    from quill.models.kernels.onednn_ops import WIDE_OUTPUTS

    ops = OneDnnLayerOps()
    narrow, wide, x = torch.randn(64, 16), torch.randn(WIDE_OUTPUTS, 16), torch.randn(4, 16)
    torch.set_num_threads(1)  # the fixture puts its count back
    with torch.inference_mode():
        torch.testing.assert_close(ops.linear(x, narrow, None), F.linear(x, narrow))
        torch.testing.assert_close(ops.linear(x, wide, None), F.linear(x, wide), atol=1e-5, rtol=1e-5)
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert ops.is_packed(narrow) == avx512 and ops.is_packed(wide)


@pytest.mark.parametrize("key", ["gcnn", "fconv"])
def test_convolutional_families_multiply_by_their_kernels_through_the_layer_ops(key, tmp_path, tiny_tokenizer):
    """The gated CNN's and fconv's steps multiply by their kernels as matrices through the loader's ops: each kernel
    packed once (one matrix view per weight, not a new one a step), the same scores as through the reference ops."""
    from quill.models.families.registry import ARCHITECTURES
    from quill.models.loading.checkpoint import load_checkpoint
    from quill.models.loading.saving import save_checkpoint

    if key == "gcnn":
        arch, reference = build_tiny_model(key, tiny_tokenizer.vocab_size, device="cpu")
    else:  # kernels of 3, 1 and 2, residuals from one layer back and none
        config_cls, model_cls = ARCHITECTURES[key]
        arch, reference = key, model_cls(config_cls(vocab_size=tiny_tokenizer.vocab_size, embed_dim=16,
                                                    layers=[[24, 3, 1], [24, 1, 0], [16, 2, 1]], out_embed_dim=16))
    save_checkpoint(tmp_path, arch, reference, tiny_tokenizer, dtype=torch.float32)
    model = load_checkpoint(tmp_path, device="cpu", dtype="float32", layer_ops="onednn").model
    ops = model.layer_ops
    assert ops.name == "onednn"
    convs = [m for m in model.modules() if hasattr(m, "matrix")]
    kernels = [conv.matrix(conv.conv.weight if key == "gcnn" else conv.weight) for conv in convs]

    def steps(layer_ops) -> list[torch.Tensor]:
        model.layer_ops, state = layer_ops, model.new_state(2)
        chunks = [([[5, 6, 7], [8, 9]], [0, 0]), ([[10], [11]], [3, 2])]  # prompts, then a decode step
        return [model.step(StepBatch.build(tokens, starts, slots=[0, 1], logits="all"), state)
                for tokens, starts in chunks]

    with torch.inference_mode():
        fast, plain = steps(ops), steps(TORCH_OPS)
    for got, expected in zip(fast, plain):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert all(ops.is_packed(matrix) for matrix in kernels)
    assert all(conv.matrix(conv.conv.weight if key == "gcnn" else conv.weight) is matrix
               for conv, matrix in zip(convs, kernels))


@pytest.mark.parametrize("tied", [True, False])
def test_mamba_output_layer_goes_through_the_layer_ops(tied, tmp_path):
    """Mamba's output layer (its embeddings where tied) runs through the loader's ops, packed once: the same logits
    as through the reference ops."""
    pytest.importorskip("transformers")
    from quill.models.loading.checkpoint import load_checkpoint
    from tests.hf_state_models.mamba import save_tiny

    save_tiny(tmp_path, tie_word_embeddings=tied)
    model = load_checkpoint(tmp_path, device="cpu", dtype="float32", layer_ops="onednn").model
    ops = model.layer_ops
    assert ops.name == "onednn" and (model.lm_head is None) == tied

    def step(layer_ops) -> torch.Tensor:
        model.layer_ops = layer_ops
        batch = StepBatch.build([[5, 6, 7], [8, 9]], [0, 0], slots=[0, 1], logits="all")
        return model.step(batch, model.new_state(2))

    with torch.inference_mode():
        fast, plain = step(ops), step(TORCH_OPS)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    head = model.backbone.embeddings.weight if tied else model.lm_head.weight
    assert ops.is_packed(head)


def test_padded_row_counts_are_few_and_waste_at_most_an_eighth_past_128_rows():
    from quill.models.kernels.onednn_ops import padded_rows

    counts = [padded_rows(r) for r in range(1, 8193)]
    assert counts[:16] == list(range(1, 17))
    assert all(c >= r for r, c in enumerate(counts, 1)) and all(c % 16 == 0 for c in counts[16:])
    assert all((c - r) / r < 1 / 8 for r, c in enumerate(counts, 1) if r > 128)
    assert len(set(counts)) == 71


@pytest.mark.parametrize("shape", [(37, 32), (3, 13, 32)])  # padded to 48 and to 48 rows
def test_a_padded_bfloat16_product_equals_the_unpadded_one(shape, monkeypatch):
    """On CPUs with AMX, bfloat16 inputs run at a padded row count; the extra rows are cut off the answer. Where
    oneDNN has no bfloat16 kernel the product goes F.linear's way, padded or not."""
    from quill.models.kernels import onednn_ops

    weight, bias = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    with torch.inference_mode():
        answers = {}
        for amx in (False, True):
            monkeypatch.setattr(onednn_ops, "_has_amx", lambda amx=amx: amx)
            ops = OneDnnLayerOps()
            answers[amx] = ops.linear_act(x, weight, bias, "gelu")
            assert ops.is_packed(weight) == cpu_has_bf16()
    assert answers[True].shape == (*shape[:-1], 64) and answers[True].is_contiguous()
    torch.testing.assert_close(answers[True], answers[False], atol=0.02, rtol=0.01)


def test_a_taps_major_kernel_matrix_is_kept_until_its_weight_changes():
    """The gated CNN multiplies its windows, k consecutive rows, by its kernel with columns tap by tap: a copy of
    the weight, the same tensor every step (so oneDNN's packing of it is kept), made again when the weight
    changes in place or is replaced."""
    from quill.models.kernels.ops_linear import MatrixView

    view, weight = MatrixView(taps_major=True), torch.randn(6, 3, 4)  # (out, in, k)
    matrix = view(weight)
    assert matrix.shape == (6, 12) and view(weight) is matrix
    window = torch.randn(4, 3)  # k rows of `in` inputs
    torch.testing.assert_close(matrix @ window.flatten(), torch.einsum("oik,ki->o", weight, window))
    weight.mul_(2)
    torch.testing.assert_close(view(weight), 2 * matrix)
    other = torch.randn(6, 3, 4)
    torch.testing.assert_close(view(other), other.transpose(1, 2).flatten(1))


def test_a_padded_products_output_is_the_next_ones_padded_input_without_a_copy(monkeypatch):
    """An MLP's second product takes the first's output, whose storage already holds the padding rows: it reads
    them in place. Whatever they hold, the rows cut from the answer are the same."""
    from quill.models.kernels import onednn_ops

    monkeypatch.setattr(onednn_ops, "_has_amx", lambda: True)
    up, down = torch.randn(96, 32, dtype=torch.bfloat16), torch.randn(32, 96, dtype=torch.bfloat16)
    x = torch.randn(37, 32, dtype=torch.bfloat16)  # padded to 48 rows
    with torch.inference_mode():
        h = OneDnnLayerOps().linear_act(x, up, None, "relu")
        view = onednn_ops._padded_input(h, 37, 48)
        assert view.shape == (48, 96) and view.data_ptr() == h.data_ptr()
        copied = onednn_ops._padded_input(h.clone(), 37, 48)  # a tensor of its own rows only: copied, zeros after
        assert copied.data_ptr() != h.data_ptr() and not copied[37:].any()
        out = OneDnnLayerOps().linear(h, down, None)
        torch.testing.assert_close(out, torch.nn.functional.linear(h, down), atol=0.05, rtol=0.02)
