"""The engine's public face: what the HTTP routes, the hosting of models and the command line use of it, and
nothing else. Inside, one engine per model: the scheduler decides each step's work (scheduler.py) over the caches
it allocates (cache/: K,V blocks, state slots, prefix keys, the runner's device table, memory sizing), the runner
runs it on the device (runner/), the core commits it and turns it into outputs (core.py), in a thread or a process
of its own (process/: async_engine.py, process_engine.py) behind the frontend that routes talk to (frontend.py), and
tells prefix-aware routers what its K,V cache holds (kv_events/). A model may be split over a tensor-parallel group
of processes (parallel/)."""

from .process.async_engine import AsyncEngine
from .core import CacheConfig, EngineConfig, EngineStats
from .process.core_process import CoreSpec
from .process.frontend import EngineDeadError, EngineFrontend, RequestStream
from .kv_events import KVEventsConfig
from .offline import generate
from .parallel.config import ParallelConfig
from .parallel.launch import load_engine_model
from .parallel.worker import run_worker
from .outputs import CompletionOutput, RequestOutput, TokenLogprob
from .process.process_engine import EngineStartCancelled, EngineStartError, ProcessEngine
from .scheduler import QueueFullError, SchedulerConfig

__all__ = ["AsyncEngine", "CacheConfig", "CompletionOutput", "CoreSpec", "EngineConfig", "EngineDeadError",
           "EngineFrontend", "EngineStartCancelled", "EngineStartError", "EngineStats", "KVEventsConfig",
           "ParallelConfig", "ProcessEngine", "QueueFullError", "RequestOutput", "RequestStream", "SchedulerConfig",
           "TokenLogprob", "generate", "load_engine_model", "run_worker"]
