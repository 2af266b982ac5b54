"""The other ranks of a tensor-parallel group, as rank 0 holds them: where they meet, the processes it started.

Rank 0 hosts the group's store (a `TCPStore`) at MASTER_ADDR:MASTER_PORT, or on the loopback at a free port, and
writes there what every rank loads (`SPEC`). The other ranks run `quill tp-worker` (worker.py) with torch.distributed's
usual environment, started by rank 0 (`spawn`) or apart, as on other machines, and find it by that environment. Each
says in the store when its shard is loaded, or why it could not be; then the group meets. A process rank 0 started
that exits is noticed before the next step; one started elsewhere, by its collectives failing (a closed connection,
or a timeout).
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from ..faults import EngineStartError
from .channel import StepChannel

log = logging.getLogger("quill.engine")

SPEC = "quill/spec"
READY = "quill/ready/{}"
FAILED = "quill/failed/{}"
# A rank that waits in the store waits for rank 0's next message: for as long as the server is idle.
STORE_TIMEOUT = datetime.timedelta(days=365)
STOP_SECONDS = 10.0  # a rank told to stop that has not exited by then is killed


def open_store(size: int, external: bool) -> dist.TCPStore:
    """Rank 0's store, listening on every interface at MASTER_PORT where it is set, else at a free port (ranks
    started apart need to know it)."""
    port = os.environ.get("MASTER_PORT")
    if external and port is None:
        raise ValueError("tensor-parallel workers started apart find rank 0 at MASTER_ADDR:MASTER_PORT: set "
                         "MASTER_PORT, the port rank 0 listens on")
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        return dist.TCPStore(address, int(port or 0), size, True, timeout=STORE_TIMEOUT, wait_for_workers=False)
    except RuntimeError as e:  # the port taken (MASTER_PORT set for two models), or not ours to bind
        raise EngineStartError(f"cannot open the tensor-parallel group's store at port {port or 0}: {e}") from None


def join_store(address: str, port: int, size: int) -> dist.TCPStore:
    """A rank's connection to rank 0's store."""
    return dist.TCPStore(address, port, size, False, timeout=STORE_TIMEOUT)


def group_store(store: dist.Store) -> dist.Store:
    """The group's own keys (its rendezvous), apart from the messages'."""
    return dist.PrefixStore("quill/group", store)


class Ranks:
    def __init__(self, store: dist.TCPStore, size: int, spec: dict, devices: list[int | None] | None):
        """Write `spec` (what every rank loads) into `store`; `devices`: start ranks 1.. here, rank r on CUDA device
        devices[r - 1] (None: the CPU), or None: they are started apart."""
        self.store = store
        self.size = size
        self.channel: StepChannel | None = None  # once the group has met
        self.processes: list[subprocess.Popen] = []
        self._stopped = False
        store.set(SPEC, json.dumps(spec))
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")
        for rank, device in enumerate(devices or [], 1):
            env = {**os.environ, "MASTER_ADDR": address, "MASTER_PORT": str(store.port), "RANK": str(rank),
                   "WORLD_SIZE": str(size), "LOCAL_RANK": str(device if device is not None else rank)}
            process = subprocess.Popen([sys.executable, "-m", "quill.cli", "tp-worker"], env=env,
                                       stdin=subprocess.DEVNULL)
            self.processes.append(process)
            log.info("tensor-parallel rank %d: process %d", rank, process.pid)

    def check(self) -> None:
        """RuntimeError if a rank this process started has exited."""
        for rank, process in enumerate(self.processes, 1):
            if process.poll() is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} (process {process.pid}) exited with code "
                                   f"{process.returncode}")

    def wait_ready(self, timeout: float) -> None:
        """Until every other rank has loaded its shard; EngineStartError naming the rank that could not."""
        waiting = set(range(1, self.size))
        deadline = time.monotonic() + timeout
        while waiting:
            for rank in sorted(waiting):
                if self.store.check([FAILED.format(rank)]):
                    reason = self.store.get(FAILED.format(rank)).decode()
                    raise EngineStartError(f"tensor-parallel rank {rank} could not load its shard: {reason}")
                if self.store.check([READY.format(rank)]):
                    waiting.discard(rank)
            try:
                self.check()
            except RuntimeError as e:
                raise EngineStartError(f"{e} while loading its shard") from None
            if waiting and time.monotonic() > deadline:
                raise EngineStartError(f"tensor-parallel ranks {sorted(waiting)} did not load their shards within "
                                       f"{timeout:.0f}s (started apart: is `quill tp-worker` running for each, with "
                                       "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE?)")
            time.sleep(0.05)

    def stop(self) -> None:
        """Tell the other ranks to exit; kill those this process started that have not within STOP_SECONDS."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self.channel is not None:
            try:
                self.channel.send({"ops": [], "stop": True})
            except Exception:  # noqa: BLE001 - a rank gone already: the others see the store close
                pass
        deadline = time.monotonic() + STOP_SECONDS
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def abandon(self) -> None:
        """The group is broken: kill the ranks this process started (they may wait in a collective)."""
        self._stopped = True
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def device_indices(device: torch.device, size: int) -> list[int | None]:
    """The CUDA device of each rank past 0 that rank 0 starts (the ones after its own), None each on the CPU;
    ValueError if the machine has too few."""
    if device.type != "cuda":
        return [None] * (size - 1)
    count = torch.cuda.device_count()
    if device.index + size > count:
        raise ValueError(f"tensor-parallel size {size} needs {size} CUDA devices from {device} on; this machine has "
                         f"{count}")
    return [device.index + rank for rank in range(1, size)]
