"""Host lists to device tensors without waiting for the device.

`torch.tensor(values, device="cuda")` copies from pageable memory synchronously: it returns only once
the GPU has run everything queued before the copy, so each such call in a step stalls the host while
the previous kernels run, and an overlapped step (quill/server/engine/overlap.py) stops overlapping. A copy
marked non_blocking is staged by the driver before the call returns (the list's memory may go at
once) and runs in stream order, so the kernels queued after it still see its values.
"""

from __future__ import annotations

import torch


def to_device(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` on `device`, queued rather than waited for."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
