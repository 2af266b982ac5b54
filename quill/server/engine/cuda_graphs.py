"""Capturing a step as a CUDA graph and replaying it: the one layer that calls torch.cuda.graph.

The runner hands `capture` a function that runs one decode step over its persistent buffers and
gets back a `Replay`: calling it re-runs the step on whatever those buffers hold now and returns the
same output tensor every time (the graph writes into memory captured once). Everything else about
graphs (buckets, padding, what the step reads) lives in the runner, so a stand-in with this contract
that simply calls the function again runs the very same code on a CPU (the tests do that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

# Runs before capture: compile Triton kernels, let cuBLAS / cuDNN pick their algorithms, and warm the
# allocator, none of which may happen while a stream is being captured.
WARMUP_RUNS = 2


class Replay(Protocol):
    def __call__(self) -> torch.Tensor:
        """Run the captured step again; returns its output (the same tensor on every call)."""


class GraphCapture(Protocol):
    def capture(self, step: Callable[[], torch.Tensor]) -> Replay:
        """Record `step`; it must read and write only tensors that outlive it."""

    def memory_in_use(self) -> int:
        """Device memory in use now, in bytes: what capturing took is the difference."""

    def release(self) -> None:
        """Drop every graph captured and give their memory back (after a capture failed)."""


class GraphCaptureError(RuntimeError):
    """Capturing the decode step of `batch_size` sequences failed."""

    def __init__(self, batch_size: int, cause: Exception):
        super().__init__(f"batch of {batch_size} sequences: {type(cause).__name__}: {cause}")
        self.batch_size = batch_size


class CudaGraphs:
    """Graphs of one engine on one CUDA device, sharing one memory pool.

    Capture the largest batch first: every later (smaller) graph then fits in the pool's blocks, so
    the pool holds about one step's activations at the largest bucket, whatever the number of graphs.
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(self.device)  # capture needs a stream other than the default
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def capture(self, step: Callable[[], torch.Tensor]) -> Replay:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            for _ in range(WARMUP_RUNS):
                step()
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (another model's engine) does not spoil this capture.
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            output = step()
        self.graphs.append(graph)
        return _CudaReplay(graph, output)

    def memory_in_use(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)  # the pool and the graphs' own driver memory
        return total - free

    def release(self) -> None:
        """The pool's blocks go back to the allocator once no graph holds them, then to the device."""
        for graph in self.graphs:
            graph.reset()
        self.graphs.clear()
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


class _CudaReplay:
    def __init__(self, graph: torch.cuda.CUDAGraph, output: torch.Tensor):
        self.graph = graph
        self.output = output

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.output
