"""The CPU's decode attention kernel (cpu_paged_decode.cpp), compiled on this machine the first time it is needed.

It reads each sequence's keys and values in place from the blocks its table lists: no copy into contiguous
buffers and no padding to the longest context, which is what the gather-and-SDPA path spends half its time
on. PyTorch compiles it with the machine's C++ compiler (g++, with OpenMP, tuned for this CPU) through ninja,
once per machine: the build is kept in PyTorch's extensions folder (TORCH_EXTENSIONS_DIR, by default under
~/.cache), named after this CPU's instruction sets so that a copy carried to another CPU builds its own. Where
there is no compiler, `kernel()` says why and the SDPA path serves.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")


def _cpu_flags() -> str:
    """This CPU's instruction-set flags (Linux), for the build's name: -march=native code runs only where built."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1]
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def kernel():
    """The compiled module, or the reason it could not be built (a string)."""
    try:
        import ninja  # the build tool PyTorch's extension loader runs; a pip package that puts it in BIN_DIR
        from torch.utils import cpp_extension
    except ImportError as e:
        return f"cannot be built here ({e.name} is not installed)"
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    tag = hashlib.sha256((SOURCE.read_text() + _cpu_flags()).encode()).hexdigest()[:12]
    try:
        log.info("building the CPU attention kernel (once per machine) ...")
        return cpp_extension.load(
            name=f"quill_cpu_paged_decode_{tag}", sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no headers, a failed build: SDPA serves instead
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return f"did not build ({reason})"
