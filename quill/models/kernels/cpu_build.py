"""C++ kernels for the CPU, compiled on this machine the first time one is needed.

PyTorch compiles a source with the machine's C++ compiler (g++, with OpenMP, tuned for this CPU) through ninja,
once per machine: the build is kept in PyTorch's extensions folder (TORCH_EXTENSIONS_DIR, by default under
~/.cache), named after the source and this CPU's instruction sets, so that a copy carried to another CPU builds
its own. Where there is no compiler, `build` returns the reason and the caller runs its PyTorch path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)


def _cpu_flags() -> str:
    """This CPU's instruction-set flags (Linux), for the build's name: -march=native code runs only where built."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build(source: Path, what: str):
    """The compiled module of `source` (a C++ file with a pybind11 module), or why it could not be built (a
    string). `what` names it in the log. Callers cache the result: a build takes about 30 s the first time."""
    try:
        import ninja  # the build tool PyTorch's extension loader runs; a pip package that puts it in BIN_DIR
        from torch.utils import cpp_extension
    except ImportError as e:
        return f"cannot be built here ({e.name} is not installed)"
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    tag = hashlib.sha256((source.read_text() + _cpu_flags()).encode()).hexdigest()[:12]
    try:
        log.info("building %s (once per machine) ...", what)
        return cpp_extension.load(
            name=f"quill_{source.stem}_{tag}", sources=[str(source)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no headers, a failed build: the PyTorch path serves instead
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return f"did not build ({reason})"
