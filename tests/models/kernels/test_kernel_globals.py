"""A compiled Triton kernel may read a module's global only if it is a `tl.constexpr` (or a module or another
kernel): a plain float compiles under the CPU's interpreter and fails on the GPU at the first launch."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import textwrap
import types

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

KERNEL_MODULES = ["quill.models.attention.triton_kernel", "quill.models.kernels.gated_act",
                  "quill.models.kernels.rms_norm", "quill.models.kernels.rope", "quill.models.kernels.state_steps"]


KERNEL = triton.runtime.jit.KernelInterface  # a compiled kernel and its interpreted stand-in alike


def kernels(module) -> list:
    return [value for value in vars(module).values() if isinstance(value, KERNEL)]


def globals_a_compiled_kernel_refuses(kernel) -> list[str]:
    fn = kernel.fn
    names = {node.id for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn))))
             if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    allowed = (types.ModuleType, KERNEL, tl.constexpr, type)
    names -= set(inspect.signature(fn).parameters)  # an argument shadows a global of its name
    return sorted(name for name in names if name in fn.__globals__
                  and not isinstance(fn.__globals__[name], allowed) and not callable(fn.__globals__[name]))


@pytest.mark.parametrize("module_name", KERNEL_MODULES)
def test_kernels_read_only_constexpr_globals(module_name):
    module = importlib.import_module(module_name)
    found = kernels(module)
    assert found, f"no Triton kernel in {module_name}"
    for kernel in found:
        assert globals_a_compiled_kernel_refuses(kernel) == [], kernel.fn.__name__


def test_a_plain_float_global_is_found(tmp_path):
    path = tmp_path / "plain_global.py"
    path.write_text("import triton\nSCALE = 0.5\n\n@triton.jit\ndef kernel(x):\n    return x * SCALE\n")
    spec = importlib.util.spec_from_file_location("plain_global", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert globals_a_compiled_kernel_refuses(module.kernel) == ["SCALE"]
