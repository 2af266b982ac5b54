"""The engine process: one hosted model's `EngineCore`, alone in an interpreter of its own.

Started by `ProcessEngine` (spawned, so CUDA initialises only here), it loads the checkpoint's
weights itself, says "ready" (or why it could not load), then loops: apply the requests and aborts
that came down the pipe, run a step, send one message back carrying every request's outputs of that
step and a stats snapshot. Detokenization and stop rules stay in this process, inside the step:
a stop string can only be recognised from the text, and detokenizing costs about 0.5 ms of a 6 ms
step at 256 streams on a 2-core CPU, while the API process is the busier of the two (at 256 streams
it spent 1.3-1.5 s of CPU for every 1 s the engine process spent, benchmarks/server_overhead.py):
moving the text there would slow the side that already limits throughput.

Both pipes carry typed messages (messages.py) in frames (wire.py). Down: AddRequest, AbortRequest,
Stop. Up: Ready or Failed once, then a StepOutputs per step that ran or applied requests.
"""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

from quill.models.loading.location import ModelLocation

from ..core import EngineConfig, EngineCore
from .core_loop import CoreLoop
from ..parallel.launch import load_engine_model
from ..cpu_threads import step_threads
from ..faults import DeviceLostError
from .messages import DOWN, CoreInfo, Failed, MessageKind, Ready, Refusal, StepOutputs
from .wire import MessageReader, MessageWriter

log = logging.getLogger("quill.engine")

IDLE_POLL_SECONDS = 0.5  # an idle core waits this long for a message before checking the pipe again


@dataclass
class CoreSpec:
    """Everything the engine process needs to load its model and build its core (picklable)."""

    name: str
    path: str | ModelLocation  # located by the API process: a hub id's branch already resolved to a commit
    load_options: dict  # keyword arguments of load_checkpoint: device, dtype, attention_backend, ...
    engine_config: EngineConfig
    threads: int | str | None = None


def run_core_process(conn: Connection, up: Connection, spec: CoreSpec) -> None:
    """The engine process's main function: requests come on `conn`, outputs go up `up`."""
    # Ctrl-C in a terminal reaches the whole process group: the API process decides when this one stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    writer = MessageWriter(up.fileno())
    try:
        loaded = load_engine_model(spec.path, spec.engine_config.parallel, name=spec.name, **spec.load_options)
        core = EngineCore(loaded, spec.engine_config)
    except Exception as e:  # CheckpointError, a bad device or dtype, out of memory: all told to the API process
        writer.send([Failed(str(e) or type(e).__name__)])
        return
    threads = step_threads(loaded.device, spec.threads)
    writer.send([Ready(CoreInfo(str(loaded.device), str(loaded.dtype).removeprefix("torch."), core.cache_bytes,
                                core.describe_cache(), core.num_kv_blocks))])
    try:
        _serve(MessageReader(conn.fileno(), DOWN), writer, CoreLoop(core, threads))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the API process is gone: so is the reason to run
    except DeviceLostError as e:  # told to the API process, which fails every stream with it; a fresh process helps
        log.error("%s", e)
        writer.send([Failed(str(e))])
        sys.exit(1)
    finally:
        core.close()


def _serve(requests: MessageReader, writer: MessageWriter, loop: CoreLoop) -> None:
    core = loop.core
    num_adds = 0
    while True:
        refusals = []
        timeout = 0.0 if core.has_work() else IDLE_POLL_SECONDS
        received = False
        while requests.ready(timeout):
            received, timeout = True, 0.0
            for message in requests.read():
                kind = message.kind
                if kind is MessageKind.ADD:
                    num_adds += 1
                    refused = loop.add(message.request_id, message.prompt_token_ids, message.params)
                    if refused is not None:
                        refusals.append(Refusal.of(*refused))
                elif kind is MessageKind.ABORT:
                    loop.abort(message.request_id)
                else:  # Stop
                    return
        stepped = core.has_work()
        outputs = [out for _, out in loop.step()] if stepped else []
        if stepped or received:
            writer.send([StepOutputs(outputs, core.stats(stepped), num_adds, refusals)])
