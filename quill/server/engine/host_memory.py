"""Freed host memory kept for the next step (glibc's malloc on Linux), for engines that compute on the CPU.

Every step allocates and frees tensors of much the same sizes (a prefill chunk's activations, the logits). glibc
hands out blocks above its mmap threshold (128 KiB at first, rising with what is freed) as fresh mappings that are
unmapped when freed, and gives the heap's free top back to the system past its trim threshold, so the next step
faults every page in again and the kernel zeroes it: 2.5 million minor page faults in a 27 s Mamba run, about a
tenth of its time. Raising both thresholds keeps freed blocks in the heap for reuse, what vLLM's CPU build gets by
preloading tcmalloc. The mmap threshold stops at 32 MiB, so blocks larger still (a beam step's (256, 58,101) logits
and their log-softmax, 60 MB each; a long prompt chunk's activations) are mapped apart whatever it says: glibc is
told to map none (M_MMAP_MAX 0), and serves them from the heap too (a (256, 58,101) log-softmax and top-k on 2
threads: 41.5 ms and 14,500 page faults a call mapped, 21.8 ms and 1,450 from the heap). The price: the process keeps
its peak heap instead of returning it. Settings the environment makes (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_MAX_) and other allocators are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger("quill.engine")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the largest glibc takes on 64-bit systems (where M_MMAP_MAX 0 is refused, it still counts)
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: the largest, 2 GiB
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_")


def _glibc():
    """The C library if it is glibc's (it has mallopt and gnu_get_libc_version), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds and stop its separate mappings, once per process; whether it was done
    here."""
    if any(name in os.environ for name in ENVIRONMENT):
        return False
    libc = _glibc()
    if libc is None:
        return False
    raised = all(libc.mallopt(name, value) for name, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                                               (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_MMAP_MAX, 0)))
    if raised:
        log.info("freed host memory is kept for reuse (glibc's blocks all from its heap, trimmed only past %d GiB "
                 "free)", (TRIM_THRESHOLD + 1) >> 30)
    return raised
