"""A tensor-parallel rank past 0: load its shard, then follow rank 0's steps until told to stop.

Started by rank 0 on its machine, or apart (`quill tp-worker`, on another machine) with torch.distributed's usual
environment: MASTER_ADDR and MASTER_PORT (rank 0's store), RANK, WORLD_SIZE, and LOCAL_RANK (its CUDA device; default
0). What to load comes from the store (ranks.py), so every rank loads the same checkpoint the same way; the
checkpoint's directory must be at the same path on every machine. A rank exits when rank 0 says stop, or when rank
0's store goes away (its process died): the store's `get` fails at once.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from quill.models.attention import select_attention_backend
from quill.models.loading.checkpoint import DTYPES, keep_float32_exact
from quill.models.parallel.collectives import connect
from quill.models.parallel.shard_loading import attach_group, load_shard
from quill.models.state import PagedKVCache

from .channel import StepChannel
from .ranks import FAILED, READY, SPEC, group_store, join_store
from .step_message import unpack

log = logging.getLogger("quill.engine")


def _environment(environ) -> tuple[str, int, int, int]:
    try:
        address, port = environ.get("MASTER_ADDR", "127.0.0.1"), int(environ["MASTER_PORT"])
        rank, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"a tensor-parallel worker needs MASTER_PORT, RANK and WORLD_SIZE in its environment ({e})")
    if not 0 < rank < size:
        raise ValueError(f"a tensor-parallel worker's RANK is from 1 to WORLD_SIZE - 1 (rank 0 is the server), not "
                         f"{rank} of {size}")
    return address, port, rank, size


def _apply(op: list, states: dict, model, device: torch.device) -> None:
    """One of rank 0's state operations (driver.py) on this rank's caches."""
    kind, state_id = op[0], op[1]
    if kind == "new":
        num_blocks, block_size, dtype, backend = op[2:]
        c = model.config
        states[state_id] = PagedKVCache(c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim,
                                        DTYPES[dtype], device,
                                        attention=select_attention_backend(backend, device))
    elif kind == "copy":
        states[state_id].copy_blocks(op[2], op[3])
    else:  # drop
        del states[state_id]
        if device.type == "cuda":
            torch.cuda.empty_cache()  # rank 0 sized the next cache with this one's memory handed back


def follow(channel: StepChannel, model, device: torch.device) -> None:
    """Run rank 0's steps on this rank's shard until rank 0 says stop."""
    states: dict[int, PagedKVCache] = {}
    while True:
        header, payload = channel.receive()
        for op in header["ops"]:
            _apply(op, states, model, device)
        if header.get("stop"):
            return
        model.step(unpack(header["step"], payload), states[header["state"]])


def run_worker(environ=os.environ) -> int:
    """A rank's whole life; its exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    address, port, rank, size = _environment(environ)
    store = join_store(address, port, size)
    spec = json.loads(store.get(SPEC))
    if spec["size"] != size:
        store.set(FAILED.format(rank), f"WORLD_SIZE is {size}, rank 0 serves tensor-parallel size {spec['size']}")
        return 2
    device = torch.device(spec["device"])
    if device.type == "cuda":
        device = torch.device("cuda", int(environ.get("LOCAL_RANK", 0)))
    dtype = DTYPES[spec["dtype"]]
    keep_float32_exact(device, dtype)
    try:
        model, plan = load_shard(Path(spec["path"]), rank, size, device, dtype, spec["attention_backend"],
                                 spec["layer_ops"])
    except Exception as e:  # noqa: BLE001 - whatever stops the load, rank 0 says it and refuses to start
        store.set(FAILED.format(rank), f"{type(e).__name__}: {e}")
        return 1
    store.set(READY.format(rank), "")
    try:
        group = connect(group_store(store), rank, size, device)
        attach_group(model, plan, group)
        log.info("tensor-parallel rank %d of %d: shard of %s loaded on %s", rank, size, spec["path"], device)
        follow(StepChannel(store, group, device), model, device)
    except RuntimeError as e:  # rank 0 gone (its store closed) or the group broken: nothing left to follow
        log.error("tensor-parallel rank %d stops: %s", rank, str(e).splitlines()[0])
        return 1
    return 0
