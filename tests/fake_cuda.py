"""Fake CUDA tensors on a machine without a GPU: tests that catch device mix-ups as CUDA would.

Inside `fake_cuda()`, PyTorch's FakeTensorMode is on: tensors made on `CUDA` ("cuda:0") are fake,
with a shape, a dtype and a device but no memory, so no GPU is needed, and an op that mixes a CUDA
tensor with a CPU one raises FakeTensorDeviceMismatchError where a GPU would raise its "Expected all
tensors to be on the same device". What a GPU allows passes here too: a 0-dim CPU scalar, CPU indices
in `t[index]`, a copy_ across devices. Every tensor made inside the mode is fake, so nothing reads
values: `.item()`, `.tolist()`, nonzero or a size that depends on values (a boolean mask, repeat_interleave
without output_size) raise DataDependentOutputException / DynamicOutputShapeException. Tests therefore
run the tensor code up to where the host reads results back, and check devices, shapes and dtypes.

A CPU-only build of PyTorch registers no device guard for CUDA, so slicing or copying a fake CUDA
tensor would fail with "PyTorch is not linked with support for cuda devices". FakeTensorMode mends
this only in CUDA builds without a device (torch._C._ensureCUDADeviceGuardSet installs PyTorch's
FakeGuardImpl when the registered CUDA guard counts no devices); `_install_cuda_guard` lets it do the
same in a CPU build, by giving that function a registered guard that counts none.
"""

from __future__ import annotations

import ctypes
import glob
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from quill.models import kernels

CUDA = torch.device("cuda", 0)


def _install_cuda_guard() -> None:
    """Make PyTorch install its fake CUDA device guard in a CPU-only build (a no-op in a CUDA build)."""
    if torch.backends.cuda.is_built():
        return  # a CUDA build registers its guard; FakeTensorMode swaps in the fake one when there is no device
    (path,) = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.*"))
    device_types = torch._C._autograd.DeviceType  # c10::DeviceType
    cuda, lazy = int(device_types.CUDA), int(device_types.Lazy)
    # c10::impl::device_guard_impl_registry: the guard of each device type, null where none is linked in.
    registry = (ctypes.c_void_p * len(device_types.__members__)).in_dll(
        ctypes.CDLL(path), "_ZN3c104impl26device_guard_impl_registryE")
    if registry[cuda]:
        return  # installed already
    # The lazy-tensor guard, linked into every build, counts no devices without a lazy backend: lent to
    # the CUDA slot, it makes _ensureCUDADeviceGuardSet put PyTorch's FakeGuardImpl<CUDA> there in its place.
    registry[cuda] = registry[lazy]
    torch._C._ensureCUDADeviceGuardSet()
    if not registry[cuda] or registry[cuda] == registry[lazy]:
        registry[cuda] = None
        raise RuntimeError("this PyTorch build did not install its fake CUDA device guard")


class _ValuelessMode(FakeTensorMode):
    """FakeTensorMode that computes nothing for real. The stock mode keeps the value of a one-element tensor
    made from host data (a "constant") and runs ops on it for real; under inference_mode one of those ops is
    the move to CUDA itself (aten.to.dtype_layout escapes its check for a device it cannot use)."""

    def may_turn_const(self, t: torch.Tensor) -> bool:
        return False


@contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """FakeTensorMode, with real tensors from outside the block accepted (as fake copies on their device). The state
    families' decode steps run eagerly: their CUDA default, Triton kernels (quill/models/kernels/state_steps.py), needs
    real memory."""
    _install_cuda_guard()
    with _ValuelessMode(allow_non_fake_inputs=True) as mode, \
            mock.patch.object(kernels, "fused_state_steps", lambda state: None), \
            mock.patch.object(torch, "frombuffer", _fake_frombuffer):
        yield mode


def _fake_frombuffer(buffer, dtype: torch.dtype) -> torch.Tensor:
    """A fake tensor cannot wrap host memory (quill/models/host_copy.py wraps an array's): the same values made
    by torch.tensor, which the mode fakes."""
    return torch.tensor(buffer.tolist(), dtype=dtype)


def fake_model(model_cls: type[nn.Module], config, dtype: torch.dtype = torch.float32,
               device: torch.device = CUDA) -> nn.Module:
    """`model_cls(config)` with fake weights in `dtype` on `device`, made as the loader makes a model: built on
    the meta device, then weights assigned (quill/models/loading/checkpoint.py). Call inside `fake_cuda()`.

    A Transformer reads its cache through the SDPA backend with the eager layer ops, as with
    `--attention-backend sdpa --layer-ops torch`: CUDA's defaults are Triton kernels, which need real memory."""
    with torch.device("meta"):
        model = model_cls(config)
    weights = {name: torch.empty(p.shape, dtype=dtype, device=device) for name, p in model.named_parameters()}
    model.load_state_dict(weights, strict=True, assign=True)
    if hasattr(model, "attention_backend"):
        model.attention_backend = "sdpa"  # layer_ops stay the eager TORCH_OPS a model is built with
    return model.eval().requires_grad_(False)


def assert_on_cuda(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.device == CUDA, f"a tensor of shape {tuple(t.shape)} is on {t.device}, not {CUDA}"


def _caller() -> str:
    """The innermost frame of the project's own code (not torch's, not the tests')."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(root) and not path.startswith((os.path.join(root, "tests"), os.path.join(root, ".venv"))):
            return f"{os.path.relpath(path, root)}:{frame.lineno}"
    return "?"


def _argument(func, args: tuple, kwargs: dict, name: str):
    """An op's argument by its schema's name, positional or keyword (None where the op has none such)."""
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[i] if i < len(args) else kwargs.get(name)
    return None


class _WaitingCopies(TorchDispatchMode):
    """Records host-to-CUDA copies that would wait for the device (not marked non_blocking)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func.overloadpacket
        if op in (torch.ops.aten.to, torch.ops.aten._to_copy):  # .to(device): its device is the target
            source, target = args[0], _argument(func, args, kwargs, "device")
            if isinstance(target, str | torch.device):
                target = torch.device(target)
            elif target is not None and not isinstance(target, torch.device):
                target = getattr(target, "device", None)  # to.other: like another tensor
        elif op is torch.ops.aten.copy_:
            target, source = args[0].device, args[1]
        else:
            return func(*args, **kwargs)
        if (isinstance(source, torch.Tensor) and source.device.type == "cpu" and target is not None
                and target.type == "cuda" and not _argument(func, args, kwargs, "non_blocking")):
            self.found.append(f"{func} of a {tuple(source.shape)} {source.dtype} host tensor at {_caller()}")
        return func(*args, **kwargs)


@contextmanager
def waiting_copies() -> Iterator[list[str]]:
    """Inside `fake_cuda()`: the host-to-device copies made in the block that would wait until the GPU has run
    everything queued before them (torch.tensor(values, device=cuda) is one), stalling the host."""
    with _WaitingCopies() as mode:
        yield mode.found
