"""The state families' fused steps against their eager references: the same outputs, the same new state in the rows'
slots, every other slot untouched. Odd sizes (not powers of two, more than one block), slots out of order, state
tensors that are one layer's view of all layers as the models pass them. Two implementations of the same calls:
the Triton kernels (quill/models/kernels/state_steps.py; on the CPU they run in the Triton interpreter, on a GPU
compiled) and the CPU's C++ kernels (cpu_state_steps.py), which run on the CPU only."""

from __future__ import annotations

import shutil

import pytest
import torch

from quill.models.families import mlstm  # noqa: E402
from quill.models.families.mamba_scan import scan_step, selective_scan  # noqa: E402
from quill.models.families.ssd import ssd_step  # noqa: E402
from tests.conftest import KERNEL_DEVICE  # noqa: E402

SLOTS = [4, 0, 2]  # three rows in slots out of order; slots 1, 3 and 5 belong to nobody this step
NUM_SLOTS, LAYERS, LAYER = 6, 3, 1


IMPLEMENTATIONS = ["triton", "cpu"]


def kernel_module(name: str):
    """The kernels called `name`, or a skip saying why they cannot run here."""
    if name == "triton":
        pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")
        from quill.models.kernels import state_steps

        return state_steps
    if KERNEL_DEVICE.type != "cpu":
        pytest.skip("the C++ kernels run on the CPU")
    from quill.models.kernels import cpu_state_steps

    built = cpu_state_steps.steps()
    if isinstance(built, str) and shutil.which("g++") is None:
        pytest.skip(f"no C++ compiler: the CPU state-step kernels {built}")
    assert not isinstance(built, str), built  # with a compiler, a failed build is a failure
    return cpu_state_steps


@pytest.fixture(params=IMPLEMENTATIONS)
def kernels(request):
    return kernel_module(request.param)


def randn(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(KERNEL_DEVICE)


def slots():
    return torch.tensor(SLOTS, device=KERNEL_DEVICE)


def check_state(after: torch.Tensor, before: torch.Tensor, expected_rows: torch.Tensor) -> None:
    """`after` (slots, layers, ...): the rows' slots of LAYER hold `expected_rows`, everything else is as before."""
    expected = before.clone()
    expected[slots(), LAYER] = expected_rows
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [16, 12])  # 12: the C++ kernel's eight-wide vectors and a remainder
def test_mamba_step_matches_the_eager_scan_step(kernels, n):
    rows, d = len(SLOTS), 200  # 200 channels: two blocks, the second partly masked
    state = randn(NUM_SLOTS, LAYERS, d, n, seed=0)
    before = state.clone()
    u, dt = randn(rows, d, seed=1), torch.nn.functional.softplus(randn(rows, d, seed=2))
    A = -torch.exp(randn(d, n, seed=3, scale=0.5))
    B, C = randn(rows, n, seed=4), randn(rows, n, seed=5)
    y_ref, state_ref = scan_step(u, dt, A, B, C, before[slots(), LAYER])
    y = kernels.mamba_step_(state[:, LAYER], slots(), u, dt, A, B, C)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    check_state(state, before, state_ref)


def test_mamba_scan_matches_the_eager_scan_and_padding_is_inert(kernels):
    rows, tokens, d, n = len(SLOTS), 7, 40, 16
    state = randn(NUM_SLOTS, LAYERS, d, n, seed=0)
    before = state.clone()
    u, dt = randn(rows, tokens, d, seed=1), torch.nn.functional.softplus(randn(rows, tokens, d, seed=2))
    dt[1, 3:] = 0  # the second row is three tokens long: the rest is padding
    A = -torch.exp(randn(d, n, seed=3, scale=0.5))
    B, C = randn(rows, tokens, n, seed=4), randn(rows, tokens, n, seed=5)
    y_ref, state_ref = selective_scan(u, dt, A, B, C, before[slots(), LAYER], length=tokens)
    y = kernels.mamba_scan_(state[:, LAYER], slots(), u, dt, A, B, C)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    check_state(state, before, state_ref)
    _, after_three = selective_scan(u[1:2, :3], dt[1:2, :3], A, B[1:2, :3], C[1:2, :3], before[SLOTS[1:2], LAYER])
    torch.testing.assert_close(state[SLOTS[1], LAYER], after_three[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_the_cpu_convolution_step_matches_conv1d_and_slides_the_windows(bias):
    """Mamba-1's decode convolution (the C++ kernels alone have it): silu(conv1d) over each row's window then its
    input, 21 channels (two vectors of eight and a remainder), and each window moved on by one input."""
    kernels = kernel_module("cpu")
    rows, d, k = len(SLOTS), 21, 4
    window = randn(NUM_SLOTS, LAYERS, d, k - 1, seed=0)
    before = window.clone()
    x, weight = randn(rows, d, seed=1), randn(d, k, seed=2)
    b = randn(d, seed=3) if bias else None
    y = kernels.conv_step_(window[:, LAYER], slots(), x, weight, b)
    inputs = torch.cat([before[slots(), LAYER], x[:, :, None]], dim=-1)  # (rows, d, k)
    expected = torch.nn.functional.silu(torch.nn.functional.conv1d(inputs, weight[:, None], b, groups=d))[..., 0]
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    check_state(window, before, inputs[..., 1:])


@pytest.mark.parametrize("groups", [1, 2])
def test_ssd_step_matches_the_eager_step(kernels, groups):
    rows, heads, p, n = len(SLOTS), 4, 24, 12  # sizes that are not powers of two: masked lanes
    state = randn(NUM_SLOTS, LAYERS, heads, p, n, seed=0)
    before = state.clone()
    x, dt = randn(rows, heads, p, seed=1), torch.nn.functional.softplus(randn(rows, heads, seed=2))
    A = -torch.exp(randn(heads, seed=3, scale=0.5))
    B, C = randn(rows, groups, n, seed=4), randn(rows, groups, n, seed=5)
    y_ref, state_ref = ssd_step(x, dt, A, B, C, before[slots(), LAYER])
    y = kernels.ssd_step_(state[:, LAYER], slots(), x, dt, A, B, C)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    check_state(state, before, state_ref)


def test_mlstm_step_matches_the_eager_step(kernels):
    rows, heads, dk, dv = len(SLOTS), 2, 80, 72  # Dk over two blocks of 64, Dv over two: every loop and mask
    C = randn(NUM_SLOTS, LAYERS, heads, dk, dv, seed=0, scale=0.1)
    n = randn(NUM_SLOTS, LAYERS, heads, dk, seed=1, scale=0.1)
    m = randn(NUM_SLOTS, LAYERS, heads, seed=2)
    before = [t.clone() for t in (C, n, m)]
    q, k, v = randn(rows, heads, dk, seed=3), randn(rows, heads, dk, seed=4), randn(rows, heads, dv, seed=5)
    i, f = randn(rows, heads, seed=6, scale=3.0), randn(rows, heads, seed=7, scale=3.0)  # both gate regimes
    old = tuple(t[slots(), LAYER] for t in before)
    h_ref, (C_ref, n_ref, m_ref) = mlstm.step(q, k, v, i, f, old, eps=1e-6)
    h, n_new, m_new = kernels.mlstm_step_(C[:, LAYER], n[:, LAYER], m[:, LAYER], slots(), q, k, v, i, f, eps=1e-6)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(n_new, n_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m_new, m_ref, atol=1e-5, rtol=1e-5)
    check_state(C, before[0], C_ref)
    # n and m are the caller's to store: the kernel leaves them as they were
    assert torch.equal(n, before[1]) and torch.equal(m, before[2])


def test_a_state_that_is_not_float32_is_refused(kernels):
    state = torch.zeros(2, 4, 8, dtype=torch.float64, device=KERNEL_DEVICE)
    row = torch.zeros(1, 4, device=KERNEL_DEVICE)
    with pytest.raises(ValueError, match="float32"):
        kernels.mamba_step_(state, torch.tensor([0], device=KERNEL_DEVICE), row, row,
                            torch.zeros(4, 8, device=KERNEL_DEVICE), torch.zeros(1, 8, device=KERNEL_DEVICE),
                            torch.zeros(1, 8, device=KERNEL_DEVICE))


TINY_MODELS = {
    "mamba": dict(d_model=16, n_layers=2, d_state=8, d_inner=40, dt_rank=4),
    "mamba2": dict(hidden_size=16, num_layers=2, expand=2, num_heads=4, head_dim=8, state_size=8, n_groups=2,
                   conv_kernel=4, chunk_size=8),
    "xlstm": dict(d_model=32, n_blocks=2, n_heads=2, chunk_size=8),
}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("arch", list(TINY_MODELS))
def test_a_models_decode_steps_through_the_kernels_match_its_eager_steps(arch, implementation, monkeypatch):
    """The model routes its decode steps (and Mamba-1 its prompts) to the kernels: prompts of three lengths in slots
    out of order, then decode steps; the logits and every slot's state match the eager model's. (The router offers
    the Triton kernels only on CUDA; here it is told to offer them, and on the CPU they run in the interpreter.)"""
    from quill.models import kernels as kernel_router
    from quill.models.batch import StepBatch
    from quill.models.families.registry import ARCHITECTURES

    config_cls, model_cls = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=50, **TINY_MODELS[arch])).eval().to(KERNEL_DEVICE)
    prompts = [[3, 9, 27, 4, 1], [7, 7], [12, 30, 2]]
    where = dict(slots=SLOTS, device=KERNEL_DEVICE)

    module = kernel_module(implementation)
    offered = []  # layers the router sent to the kernels

    def run(fused: bool) -> tuple[list[torch.Tensor], dict]:
        def router(state: torch.Tensor):
            if not fused:
                return None
            offered.append(state.shape)
            return module

        monkeypatch.setattr(kernel_router, "fused_state_steps", router)
        state = model.new_state(NUM_SLOTS)
        with torch.no_grad():
            logits = [model.step(StepBatch.build(prompts, [0, 0, 0], **where), state)]
            positions = [len(p) for p in prompts]
            for _ in range(3):
                tokens = [[int(t)] for t in logits[-1].argmax(-1)]
                logits.append(model.step(StepBatch.build(tokens, positions, **where), state))
                positions = [p + 1 for p in positions]
        return logits, {name: t.clone() for name, t in state.tensors.items()}

    eager_logits, eager_state = run(fused=False)
    fused_logits, fused_state = run(fused=True)
    # three decode steps of two layers each; Mamba-1's prompts too (its scan has a kernel), the others' eagerly
    assert len(offered) == (4 if arch == "mamba" else 3) * 2
    for eager, fused in zip(eager_logits, fused_logits):
        torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)
    for name in eager_state:
        torch.testing.assert_close(fused_state[name], eager_state[name], atol=1e-5, rtol=1e-5)



def test_the_router_offers_the_cpu_kernels_for_a_float32_state_on_the_cpu():
    from quill.models import kernels as kernel_router

    module = kernel_module("cpu")
    assert kernel_router.fused_state_steps(torch.zeros(2, 3, 4)) is module
    assert kernel_router.fused_state_steps(torch.zeros(2, 3, 4, dtype=torch.float64)) is None  # tests' float64 path
