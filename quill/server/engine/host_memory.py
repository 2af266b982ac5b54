"""Freed host memory kept for the next step (glibc's malloc on Linux), for engines that compute on the CPU.

Every step allocates and frees tensors of much the same sizes (a prefill chunk's activations, the logits). glibc
hands out blocks above its mmap threshold (128 KiB at first, rising with what is freed) as fresh mappings that are
unmapped when freed, and gives the heap's free top back to the system past its trim threshold, so the next step
faults every page in again and the kernel zeroes it: 2.5 million minor page faults in a 27 s Mamba run, about a
tenth of its time. Raising both thresholds keeps freed blocks in the heap for reuse, what vLLM's CPU build gets by
preloading tcmalloc. The price: the process keeps its peak heap instead of returning it. Thresholds the
environment sets (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) and other allocators are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger("quill.engine")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the largest glibc takes on 64-bit systems: bigger blocks are still mapped apart
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: the largest, 2 GiB
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _glibc():
    """The C library if it is glibc's (it has mallopt and gnu_get_libc_version), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; whether they were raised here."""
    if any(name in os.environ for name in ENVIRONMENT):
        return False
    libc = _glibc()
    if libc is None:
        return False
    raised = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                          TRIM_THRESHOLD))
    if raised:
        log.info("freed host memory is kept for reuse (glibc's mmap threshold %d MiB, its heap trimmed only past "
                 "%d GiB free)", MMAP_THRESHOLD >> 20, (TRIM_THRESHOLD + 1) >> 30)
    return raised
