"""The CPU's decode attention kernel (cpu_paged_decode.cpp), compiled on this machine the first time it is needed.

It reads each sequence's keys and values in place from the blocks its table lists: no copy into contiguous
buffers and no padding to the longest context, which is what the gather-and-SDPA path spends half its time
on. Built by quill/models/kernels/cpu_build.py; where there is no compiler, `kernel()` says why and the SDPA
path serves.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ..kernels.cpu_build import build

SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")


@functools.cache
def kernel():
    """The compiled module, or the reason it could not be built (a string)."""
    return build(SOURCE, "the CPU attention kernel")
