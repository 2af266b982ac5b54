"""CUDA graphs emulated on any device: the `GraphCapture` contract without torch.cuda.graph.

`EmulatedGraphs.capture` runs the step once (the warm-up), then once more under `HostSyncGuard`, which
refuses what a CUDA stream being captured cannot do or would freeze into the graph (reading a device
value on the host, making a tensor of host data); a replay runs the step again and copies its result
into the output tensor kept from capture, as a graph writes into the memory it captured. The runner's
graph path (buckets, padding, the bucket's fixed step over views of its persistent buffers) runs
unchanged, so comparing its answers with the eager engine's checks everything but the capture itself.
What the guard cannot see: `.tolist()` and `.cpu()` (no operator to catch on a CPU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Reading a device value on the host (.item(), int(t), bool(t)), making a tensor from host data
# (torch.tensor, torch.as_tensor: a host-to-device copy on CUDA), sizes that depend on values.
FORBIDDEN = {aten.item, aten._local_scalar_dense, aten.lift_fresh, aten.nonzero, aten.masked_select,
             aten.unique_consecutive, aten._unique2, aten.unique_dim}


class HostSyncGuard(TorchDispatchMode):
    """Raises on the operations CUDA graph capture refuses or would bake in (a `.tolist()` it cannot see)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        bad = packet in FORBIDDEN
        if packet is aten.index and any(i is not None and i.dtype == torch.bool for i in args[1]):
            bad = True  # a boolean mask: the result's size is the mask's count
        if func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor):
            bad = kwargs.get("output_size") is None  # tensor repeats: the output's size is their sum
        if bad:
            raise RuntimeError(f"{func} cannot be captured in a CUDA graph")
        return func(*args, **kwargs)


class EmulatedGraphs:
    """The capture layer of quill/server/engine/cuda_graphs.py, replaying by running the step again."""

    def __init__(self):
        self.replays: Counter[int] = Counter()  # bucket size -> replays
        self.released = False

    def capture(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        step()
        with HostSyncGuard():
            output = step()
        size = output.shape[0]

        def replay() -> torch.Tensor:
            self.replays[size] += 1
            return output.copy_(step())

        return replay

    def memory_in_use(self) -> int:
        return 0

    def release(self) -> None:
        self.released = True
