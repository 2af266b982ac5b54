"""Server settings: every flag of `quill serve` also reads an environment variable QUILL_<FLAG>."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from quill.models.attention import ATTENTION_BACKENDS
from quill.models.loading.checkpoint import BUNDLED_DIR, GENERATION_CONFIG_MODES
from quill.models.kernels import LAYER_OPS
from quill.models.loading.location import check_revision, is_hub_id
from quill.server.api.openai.tool_calls.registry import TOOL_CALL_FORMATS

EVENT_LOOPS = ("auto", "asyncio", "uvloop")  # uvicorn's names
HTTP_PARSERS = ("auto", "h11", "httptools")
# The bundled models (quill/models/checkpoints/, trained by `quill train`); the first is the default
DEFAULT_MODELS = ["shakespeare-transformer", "shakespeare-lstm", "shakespeare-gcnn", "shakespeare-char-lstm",
                  "shakespeare-restore-transformer", "shakespeare-restore-fconv", "shakespeare-restore-lstm"]


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    models: list[str] = field(default_factory=list)  # NAME=MODEL or MODEL (directory or hub id); empty: bundled
    revisions: list[str] = field(default_factory=list)  # [NAME=]REV: the hub revision of model NAME (or every hub id)
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_queue: int = 256
    cache_bytes: int | None = None  # per model (K,V, or state snapshots); None: from the GPU on CUDA, else 256 MiB
    gpu_memory_utilization: float = 0.9  # of the GPU's memory: weights, activations and K,V caches of all models
    block_size: int = 16
    attention_backend: str = "auto"  # "auto": triton on CUDA, cpu on the CPU where it builds (models.attention)
    layer_ops: str = "auto"  # "auto": fused triton kernels on CUDA, onednn on the CPU (models.kernels)
    max_model_len: int | None = None  # None: the model's context (attention), 4096 (recurrent, convolutional, SSM)
    generation_config: str = "auto"  # "auto": sampling defaults from the checkpoint's generation_config.json; "none"
    chat_templates: list[str] = field(default_factory=list)  # [NAME=]FILE: a Jinja chat template for NAME (or all)
    tool_call_parser: str | None = None  # how answers' tool calls read (tool_calls/); None: found from each template
    api_keys: list[str] = field(default_factory=list)
    max_body_bytes: int = 1 * 2**20
    body_timeout: float = 30.0  # seconds for a request body to arrive in full (slow-loris guard)
    max_n: int = 16
    max_beam_width: int = 8
    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    max_tokens_limit: int = 4096  # largest max_tokens a request may ask for
    grammar_timeout: float = 5.0  # seconds a request's JSON schema or grammar may take to compile (then 400)
    drain_seconds: float = 30.0  # SIGTERM: how long in-flight requests may take to finish
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # no CUDA graphs: every step runs eagerly (the CPU always does)
    tensor_parallel_size: int = 1  # ranks each Transformer is split over (engine/parallel/); 1: one device
    tensor_parallel_workers: str = "spawn"  # "spawn": rank 0 starts the others here; "external": `quill tp-worker`
    async_scheduling: bool | None = None  # launch a decode step before the host commits the one before it;
    # None: on for models on CUDA, off elsewhere (EngineConfig.async_scheduling)
    log_prompts: bool = False  # request logs carry token counts only unless asked
    threads: int | str | None = "auto"  # torch CPU threads per model's steps; "auto": the free usable cores; None: torch's
    # Each model's engine core in a process of its own (True) or on a thread of the server's (False); None: a
    # process on CUDA, where steps take milliseconds and the HTTP side would slow them; on the CPU a process where a
    # fixed `threads` leaves the HTTP side a core (one of two: 1.10x, float32 and bfloat16 alike), else a thread
    # (steps on every core: a process beside them was 0.93-0.95x, `benchmarks/vllm_cpu_bench.py`'s load).
    engine_process: bool | None = None
    loop: str = "auto"  # the event loop: "auto" (uvloop where installed, else asyncio), "asyncio", "uvloop"
    http: str = "auto"  # the HTTP/1.1 parser: "auto" (httptools where installed, else h11), "h11", "httptools"
    # KV-cache events for prefix-aware routers, as vLLM's --kv-events-config publishes them (engine/kv_events/)
    kv_events_endpoint: str | None = None  # ZMQ PUB endpoint; None: no events
    kv_events_replay_endpoint: str | None = None  # ZMQ ROUTER endpoint answering replay requests
    kv_events_topic: str = ""  # "{model}" in it: the model's name
    kv_events_buffer_steps: int = 10_000  # batches kept for replay

    def __post_init__(self):
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], not {self.gpu_memory_utilization}")
        if self.generation_config not in GENERATION_CONFIG_MODES:
            modes, mode = GENERATION_CONFIG_MODES, self.generation_config
            raise ValueError(f"generation_config must be one of {modes}, not {mode!r}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_FORMATS:
            raise ValueError(f"tool_call_parser must be one of {tuple(TOOL_CALL_FORMATS)}, not {self.tool_call_parser!r}")
        if self.loop not in EVENT_LOOPS or self.http not in HTTP_PARSERS:
            raise ValueError(f"loop must be one of {EVENT_LOOPS} and http one of {HTTP_PARSERS}, "
                             f"not {self.loop!r} and {self.http!r}")
        if self.kv_events_replay_endpoint is not None and self.kv_events_endpoint is None:
            raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
        if self.kv_events_buffer_steps < 1:
            raise ValueError(f"--kv-events-buffer-steps must be positive, not {self.kv_events_buffer_steps}")

    def model_specs(self) -> list[tuple[str, str]]:
        """(name, model) per hosted model; a bare hub id is named by itself, a bare directory after its name."""
        specs = self.models or [f"{name}={BUNDLED_DIR / name}" for name in DEFAULT_MODELS]
        out = []
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep:
                path, name = spec, spec if is_hub_id(spec) else os.path.basename(os.path.normpath(spec))
            out.append((name, path))
        names = [n for n, _ in out]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return out

    def model_revisions(self) -> dict[str, str]:
        """Model name -> the branch, tag or commit its hub id is read at (a model left out reads main). A bare
        REV is every hub id's; NAME=REV is model NAME's, which must be hosted by hub id."""
        specs = self.model_specs()
        hosted, hub_models = [name for name, _ in specs], [name for name, model in specs if is_hub_id(model)]
        given: dict[str | None, str] = {}
        for spec in self.revisions:
            name, sep, revision = spec.partition("=")  # a revision never holds "=", nor a model name
            if not sep:
                name, revision = None, spec
            if name in given:
                raise ValueError(f"--revision given twice for {name or 'every hub id'}")
            if name is not None and name not in hosted:
                raise ValueError(f"--revision {spec}: no hosted model is named {name!r} (hosted: {', '.join(hosted)})")
            if name is not None and name not in hub_models:
                raise ValueError(f"--revision {spec}: the model {name!r} is not a Hugging Face hub id, so it has no "
                                 "revisions")
            if name is None and not hub_models:
                raise ValueError(f"--revision {spec}: no hosted model is a Hugging Face hub id, so none has revisions")
            check_revision(revision)
            given[name] = revision
        revisions = {name: given.get(name, given.get(None)) for name in hub_models}
        return {name: revision for name, revision in revisions.items() if revision is not None}

    def chat_template_files(self) -> dict[str | None, str]:
        """Model name (None: every model) -> the chat template file that replaces its checkpoint's."""
        files = {}
        for spec in self.chat_templates:
            name, sep, path = spec.partition("=")
            if not sep or os.path.isfile(spec):  # a bare FILE (a file whose name holds "=" included)
                name, path = None, spec
            if name in files:
                raise ValueError(f"--chat-template given twice for {name or 'every model'}")
            files[name] = path
        return files


def _env(name: str, default):
    return os.environ.get(f"QUILL_{name.upper()}", default)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    d = ServerConfig()

    def arg(flag, type_, default, help_, **kw):
        dest = flag.lstrip("-").replace("-", "_")
        env = _env(dest, None)
        if env is not None and type_ is not None:
            default = type_(env)
        p.add_argument(flag, type=type_, default=default, help=f"{help_} (env QUILL_{dest.upper()})", **kw)

    arg("--host", str, d.host, "address to listen on")
    arg("--port", int, d.port, "port to listen on")
    def repeated(flag, dest, help_):
        """A repeatable flag whose environment variable holds a comma-separated list."""
        name = flag.lstrip("-").replace("-", "_")
        env = _env(name, None)
        p.add_argument(flag, dest=dest, action="append", default=env.split(",") if env else None,
                       help=f"{help_} (env QUILL_{name.upper()}, comma-separated)")

    repeated("--model", "models", "NAME=MODEL or MODEL, where MODEL is a checkpoint directory, a Hugging Face hub "
                                  "id (org/name) in the local HF cache, or a classic toolkit's model file (or its "
                                  "directory, the vocabulary beside it), converted once into $QUILL_CACHE_DIR; "
                                  "repeat for several models; the first is the default (default: the bundled "
                                  "models, shakespeare-transformer first)")
    repeated("--revision", "revisions", "[NAME=]REV: read the hub id of model NAME, or of every model given by hub "
                                        "id, at REV: a branch or tag (the cache's refs/REV) or a commit, in full or "
                                        "a prefix of a cached one (default: main)")
    arg("--device", str, d.device, "auto | cpu | cuda")
    arg("--dtype", str, d.dtype, "auto | float32 | bfloat16 | float16")
    arg("--max-num-seqs", int, d.max_num_seqs, "sequences running at once per model")
    arg("--max-num-batched-tokens", int, d.max_num_batched_tokens, "tokens computed per engine step")
    arg("--max-queue", int, d.max_queue, "requests waiting per model before 429")
    arg("--cache-bytes", int, d.cache_bytes, "cache reserved per model, in bytes: a Transformer's K,V blocks "
        "(default: sized from --gpu-memory-utilization on CUDA, 256 MiB elsewhere), or a recurrent or state-space "
        "model's prefix snapshots beside its sequences' own states (default 256 MiB)")
    arg("--gpu-memory-utilization", float, d.gpu_memory_utilization,
        "on CUDA, the fraction of the GPU's memory the server may use for weights, activations and K,V caches, "
        "shared equally by the hosted models; the caches take what a profiling step leaves (--cache-bytes wins)")
    arg("--block-size", int, d.block_size, "tokens per cache block and prefix-cache granularity")
    arg("--attention-backend", str, d.attention_backend,
        "how Transformers read their paged K,V cache: auto (triton on CUDA, cpu on the CPU where its kernel "
        "builds, else sdpa), sdpa (gather + PyTorch SDPA, any device), cpu (decodes through a C++ kernel reading "
        "the blocks in place, built on the machine) or triton (one kernel reading the blocks in place)",
        choices=("auto", *ATTENTION_BACKENDS))
    arg("--layer-ops", str, d.layer_ops,
        "how Transformers run RMSNorm (with the residual add), RoPE, the gated MLP's activation and their linear "
        "layers: auto (triton on CUDA, onednn on the CPU), torch (eager PyTorch, a kernel per elementwise "
        "operation), onednn (torch's, with linear layers over weights oneDNN packs once) or triton (one fused "
        "Triton kernel each; compiled when a model first runs them)",
        choices=("auto", *LAYER_OPS))
    arg("--max-model-len", int, d.max_model_len, "longest prompt + completion, in tokens")
    arg("--tensor-parallel-size", int, d.tensor_parallel_size,
        "split each model over this many ranks, a process and a device each (CUDA devices from --device's on; "
        "gloo on the CPU): its heads, feed-forward width and vocabulary. Decoder-only Transformers only (Llama and "
        "its relatives, GPT-2); their steps then run eagerly (no CUDA graphs)")
    arg("--tensor-parallel-workers", str, d.tensor_parallel_workers,
        "spawn: this process starts the other ranks on this machine; external: they are started apart, e.g. on "
        "other machines (`quill tp-worker`, with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE), and meet this "
        "process at MASTER_ADDR:MASTER_PORT", choices=("spawn", "external"))
    arg("--generation-config", str, d.generation_config,
        "auto: settings a request leaves out default to the checkpoint's generation_config.json "
        "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens); none: Quill's defaults",
        choices=GENERATION_CONFIG_MODES)
    repeated("--chat-template", "chat_templates",
             "[NAME=]FILE: a Jinja chat template for model NAME, or for every model without NAME; it replaces "
             "the checkpoint's own (needed by /v1/chat/completions for a checkpoint that ships none)")
    arg("--tool-call-parser", str, d.tool_call_parser,
        "the format the models write tool calls in, read from their answers when a chat request gives tools with "
        "tool_choice auto: " + ", ".join(TOOL_CALL_FORMATS) + " (default: found from each model's chat template)",
        choices=tuple(TOOL_CALL_FORMATS))
    repeated("--api-key", "api_keys", "require this bearer token (repeat for several)")
    arg("--max-body-bytes", int, d.max_body_bytes, "largest request body accepted")
    arg("--body-timeout", float, d.body_timeout, "seconds a request body may take to arrive (then 408)")
    arg("--max-n", int, d.max_n, "largest n / best_of")
    arg("--max-beam-width", int, d.max_beam_width, "largest beam width")
    arg("--max-tokens-limit", int, d.max_tokens_limit, "largest max_tokens a request may ask for")
    arg("--grammar-timeout", float, d.grammar_timeout, "seconds a request's JSON schema, regex or grammar may take "
        "to compile before it is refused with a 400 (compiles are cached per schema)")
    arg("--drain-seconds", float, d.drain_seconds, "on SIGTERM, time in-flight requests get to finish")
    arg("--threads", _thread_count, d.threads, "torch CPU threads for each model's steps: a number, or 'auto' "
        "(the default): the cores this process may use (affinity mask, cgroup CPU quota) that other processes "
        "leave free, re-read every second")
    engine_env = _env("engine_process", None)
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction,
                   default=None if engine_env is None else engine_env.lower() not in ("0", "false", "no"),
                   help="run each model's engine core in a process of its own, so the HTTP side and the step loop "
                        "never share an interpreter, or (--no-engine-process) on a thread of the server's process "
                        "(default: a process on CUDA, and on the CPU where --threads leaves a core free, else a "
                        "thread; env QUILL_ENGINE_PROCESS)")
    arg("--loop", str, d.loop, "the HTTP side's event loop: auto (uvloop where installed, else asyncio's own), "
        "asyncio or uvloop", choices=EVENT_LOOPS)
    arg("--http", str, d.http, "the HTTP/1.1 implementation: auto (httptools, a C parser, where installed, else "
        "h11, pure Python), h11 or httptools", choices=HTTP_PARSERS)
    arg("--kv-events-endpoint", str, d.kv_events_endpoint, "publish the K,V prefix cache's events in vLLM's format "
        "for prefix-aware routers (llm-d) on this ZMQ PUB endpoint: tcp://*:5557 binds, tcp://HOST:PORT connects to "
        "a subscriber that binds; the Nth hosted model uses PORT+N-1 (default: no events)")
    arg("--kv-events-replay-endpoint", str, d.kv_events_replay_endpoint, "ZMQ ROUTER endpoint (bound) that "
        "replays the kept batches from a sequence number on, e.g. tcp://*:5558 (default: no replay)")
    arg("--kv-events-topic", str, d.kv_events_topic, "the topic frame of every KV-events message; {model} in it is "
        "replaced by the model's name (llm-d reads kv@POD@MODEL) (default: empty, as vLLM's)")
    arg("--kv-events-buffer-steps", int, d.kv_events_buffer_steps, "KV-events batches (one per engine step that "
        "changed the cache) kept for replay")
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", help="disable prefix caching")
    p.add_argument("--enforce-eager", action="store_true",
                   help="never replay decode steps as CUDA graphs (on CUDA they are captured at startup for "
                        "batches of 1, 2, 4, 8, then every 16 up to --max-num-seqs sequences)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="overlapped scheduling: launch each plain decode step while the host still detokenizes and "
                        "checks the stop rules of the step before (default: on for models on CUDA, where the GPU "
                        "computes meanwhile; off on the CPU, where it gains nothing)")
    p.add_argument("--log-prompts", action="store_true", help="include prompt text in request logs")


def _thread_count(value: str) -> int | str:
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'auto', got {value!r}")
    return int(value)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    fields = ServerConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    return ServerConfig(**values)
