"""A tensor-parallel group's collectives, over a c10d backend of its own: gloo on the CPU, NCCL on CUDA.

The backend is built straight from a store (`torch.distributed.ProcessGroupGloo(store, rank, size, timeout)`), not
through `init_process_group`: that one sets a process-wide default group, and a server may host several models,
each with a group of its own. A collective that waits past `timeout` for a rank (hung, or gone without closing its
connections) raises; one whose peer died raises at once (gloo: "Connection closed by peer").
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

# A rank waits in a collective only for the others to reach the same layer of the same step, unless one compiles a
# kernel on its way (Triton's first launches, seconds each): minutes mean a hang. A rank that died is seen sooner.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


class Collectives:
    """The operations a sharded model and its driver need, each waited for (NCCL's: enqueued on the stream)."""

    def __init__(self, backend, rank: int, size: int):
        self.backend = backend
        self.rank = rank
        self.size = size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        self.backend.allreduce([x]).wait()
        return x

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.backend.broadcast([x], options).wait()
        return x

    def gather(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `x` (of the same shape), in rank order, on rank 0; None on the others."""
        options = dist.GatherOptions()
        options.rootRank = 0
        x = x.contiguous()
        outputs = [[torch.empty_like(x) for _ in range(self.size)]] if self.rank == 0 else []
        self.backend.gather(outputs, [x], options).wait()
        return outputs[0] if self.rank == 0 else None


def connect(store, rank: int, size: int, device: torch.device,
            timeout: datetime.timedelta = COLLECTIVE_TIMEOUT) -> Collectives:
    """Join the group of `size` ranks that meet at `store`; returns once every rank has joined."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        backend = dist.ProcessGroupNCCL(store, rank, size, options)
    else:
        backend = dist.ProcessGroupGloo(store, rank, size, timeout)
    return Collectives(backend, rank, size)
