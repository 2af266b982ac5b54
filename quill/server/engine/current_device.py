"""The GPU a thread launches on: a model's, not GPU 0.

Tensors carry their device, but CUDA streams, events, graph capture and Triton launches use the
calling thread's current device, which is GPU 0 unless set. A model served with `--device cuda:1`
must make its GPU current in every thread that builds or steps its engine, or its events would
record on another GPU's stream (and wait for nothing) and its kernels would launch on the wrong GPU.
"""

from __future__ import annotations

import torch


def make_current(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (nothing to do off CUDA)."""
    # An index-less "cuda" is the current device by definition (and set_device refuses it).
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
