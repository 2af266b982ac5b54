"""Loading a model for an engine: whole, or split over a tensor-parallel group with rank 0 in this process.

Everything that can be refused is refused before any rank starts: a model outside the decoder-only Transformer
family, heads or a feed-forward width that do not split, more ranks than CUDA devices. Then rank 0 writes what to
load into the group's store, starts the other ranks (or waits for those started apart), loads its own shard while
they load theirs, and the group meets. The engine gets rank 0's `ParallelModel` in the `LoadedModel`.
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path

from quill.models.loading.checkpoint import CheckpointError, LoadedModel, load_checkpoint
from quill.models.loading.location import ModelLocation, locate
from quill.models.parallel.collectives import connect
from quill.models.parallel.shard_loading import attach_group, check_parallel, load_shard

from .channel import StepChannel
from ..faults import EngineStartError
from .config import ParallelConfig
from .driver import ParallelModel
from .ranks import Ranks, device_indices, group_store, open_store

log = logging.getLogger("quill.engine")

READY_TIMEOUT_SECONDS = 1800.0  # for every rank's shard to load (a large checkpoint read from a network disk)


def load_engine_model(path: str | Path | ModelLocation, parallel: ParallelConfig | None = None,
                      **load_options) -> LoadedModel:
    """`load_checkpoint(path, **load_options)`; with `parallel.size` > 1 the model split over that many ranks."""
    if parallel is None or parallel.size == 1:
        return load_checkpoint(path, **load_options)
    revision = load_options.pop("revision", None)
    location = path if isinstance(path, ModelLocation) else locate(path, revision)
    loaded = load_checkpoint(location, weights=False, **load_options)  # the tokenizer and the rest; no weights
    size = parallel.size
    check_parallel(loaded.architecture, loaded.model.config, size)
    devices = device_indices(loaded.device, size) if parallel.workers == "spawn" else None
    spec = {"path": str(location.path), "size": size, "device": loaded.device.type,
            "dtype": str(loaded.dtype).removeprefix("torch."), "attention_backend": loaded.model.attention_backend,
            "layer_ops": loaded.model.layer_ops.name}
    ranks = Ranks(open_store(size, external=devices is None), size, spec, devices)
    try:
        shard, plan = load_shard(location.path, 0, size, loaded.device, loaded.dtype, spec["attention_backend"],
                                 spec["layer_ops"])
        ranks.wait_ready(READY_TIMEOUT_SECONDS)
        group = connect(group_store(ranks.store), 0, size, loaded.device)
        attach_group(shard, plan, group)
        ranks.channel = StepChannel(ranks.store, group, loaded.device)
    except BaseException as e:
        ranks.abandon()
        if isinstance(e, (CheckpointError, EngineStartError, ValueError)) or not isinstance(e, Exception):
            raise
        # the group could not meet (a network error, a device): the server cannot start, and says so
        raise EngineStartError(f"the tensor-parallel group of {size} ranks could not start: {type(e).__name__}: "
                               f"{e}") from e
    atexit.register(ranks.stop)
    log.info("%s: split over %d tensor-parallel ranks (%s), steps run eagerly", loaded.name, size,
             "started here" if devices is not None else "started apart")
    loaded.model = ParallelModel(shard, loaded.model.config, ranks)
    return loaded
