"""Host lists to tensors, cheaply, and to the device without waiting for it.

`torch.tensor(values, device="cuda")` copies from pageable memory synchronously: it returns only once
the GPU has run everything queued before the copy, so each such call in a step stalls the host while
the previous kernels run, and an overlapped step (quill/server/engine/overlap.py) stops overlapping. A copy
marked non_blocking is staged by the driver before the call returns (the list's memory may go at
once) and runs in stream order, so the kernels queued after it still see its values.

`torch.tensor` also reads a list one Python object at a time (about 20 us for 256 ints); packing the list into an
`array.array` first and wrapping its buffer costs a third of that, which a step building several such lists
for 256 sequences feels (benchmarks/step_inputs.py).
"""

from __future__ import annotations

from array import array

import torch

_TYPECODES = {torch.long: "q", torch.int32: "i", torch.float64: "d", torch.float32: "f", torch.bool: "b"}


def host_tensor(values, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` of a flat list of numbers (bools for torch.bool), on the host."""
    code = _TYPECODES.get(dtype)
    if code is not None and isinstance(values, list) and values:
        try:
            return torch.frombuffer(array(code, values), dtype=dtype)  # the tensor keeps the array alive
        except (TypeError, OverflowError):  # not plain numbers of that kind: torch's own conversion decides
            pass
    return torch.tensor(values, dtype=dtype)


def to_device(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` on `device`, queued rather than waited for."""
    host = torch.tensor(values) if dtype is None else host_tensor(values, dtype)
    return host.to(device, non_blocking=True)
