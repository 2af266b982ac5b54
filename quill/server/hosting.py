"""The models a server hosts: each loaded once, with its own engine loop and its chat template.

With `engine_process` (the default on CUDA, and on a CPU whose --threads leave a core free) each model's engine
core runs in a process of its own, which loads the weights; this process then reads only the checkpoint's metadata
and tokenizer. A hub id's revision is resolved once, here, and both processes read that snapshot.

Loading can be stopped (the server is stopping) between models and while an engine process loads:
`ModelHost.load` then raises `LoadCancelled`, the engines it had started shut down.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from quill.models.text.chat_template import ChatTemplate, ChatTemplateError
from quill.models.loading.checkpoint import LoadedModel, load_checkpoint, resolve_device
from quill.models.loading.location import locate
from quill.models.threads import available_cores

from .config import ServerConfig
from .engine import (AsyncEngine, CacheConfig, CoreSpec, EngineConfig, EngineFrontend, EngineStartCancelled,
                     KVEventsConfig, ParallelConfig, ProcessEngine, SchedulerConfig, load_engine_model)
from .structured import GrammarCompiler

log = logging.getLogger("quill.server")

TOOL_USE_TEMPLATE = "tool_use"  # transformers renders chats given tools with the template of this name, if any
# No attention window: bounded (--max-model-len raises it) so that one request cannot run forever.
RECURRENT_MAX_MODEL_LEN = 4096


class LoadCancelled(Exception):
    """The server began to stop while its models loaded: loading stopped and the engines it had started
    were shut down."""


@dataclass
class HostedModel:
    name: str
    loaded: LoadedModel
    engine: EngineFrontend  # on a thread of this process (AsyncEngine) or in a process of its own (ProcessEngine)
    max_model_len: int
    created: int  # unix time, for /v1/models
    chat_template: ChatTemplate | None = None  # None: /v1/chat/completions answers 400 with `no_chat_reason`
    no_chat_reason: str = ""
    tool_chat_template: ChatTemplate | None = None  # the checkpoint's "tool_use" template, for requests with tools

    def template_for(self, tools: bool) -> ChatTemplate | None:
        """The template a chat renders with: given tools, the checkpoint's "tool_use" one where it has one
        (as transformers picks it), else the main one."""
        return self.tool_chat_template if tools and self.tool_chat_template is not None else self.chat_template
    grammars: GrammarCompiler | None = None  # checks and compiles constraints before they are submitted

    @property
    def tokenizer(self):
        return self.loaded.tokenizer


def read_chat_template(file: str) -> str:
    """A --chat-template file's source, checked to compile: a bad one stops the server before any model loads."""
    try:
        source = Path(file).read_text(encoding="utf-8")
        ChatTemplate(source)
    except (OSError, UnicodeDecodeError, ChatTemplateError) as e:
        raise ValueError(f"--chat-template {file}: {e}") from None
    return source


def chat_template_for(name: str, loaded: LoadedModel, source: str | None) -> tuple[ChatTemplate | None, str]:
    """The template a hosted model renders chats with: `source` (from --chat-template) if given, else the
    checkpoint's; and, when there is none, why. A checkpoint's template that does not compile disables
    chat for that model only (its completions still work)."""
    if source is not None:
        return ChatTemplate(source, loaded.special_tokens), ""
    if loaded.chat_template is None:
        return None, (f"the model {name!r} has no chat template: its checkpoint ships none (chat_template.jinja, "
                      "or chat_template in tokenizer_config.json); give one with --chat-template FILE")
    try:
        return ChatTemplate(loaded.chat_template, loaded.special_tokens), ""
    except ChatTemplateError as e:
        log.warning("%s: chat disabled: %s", name, e)
        return None, f"the chat template of {name!r} cannot be used ({e}); give another with --chat-template FILE"


def tool_template_for(name: str, loaded: LoadedModel, source: str | None) -> ChatTemplate | None:
    """The checkpoint's template named "tool_use", unless --chat-template replaced its templates."""
    tool_source = loaded.chat_templates.get(TOOL_USE_TEMPLATE)
    if source is not None or tool_source is None:
        return None
    try:
        return ChatTemplate(tool_source, loaded.special_tokens)
    except ChatTemplateError as e:
        log.warning("%s: the %r chat template is not used: %s", name, TOOL_USE_TEMPLATE, e)
        return None


def uses_engine_process(config: ServerConfig) -> bool:
    """--engine-process as given; else a process on CUDA, and on the CPU where a fixed --threads leaves the HTTP side
    a core of its own (see ServerConfig.engine_process): of the cores the process may use, whatever OMP_NUM_THREADS
    says of the compute threads."""
    if config.engine_process is not None:
        return config.engine_process
    device = resolve_device(config.device)
    if device.type == "cuda":
        return True
    return device.type == "cpu" and isinstance(config.threads, int) and config.threads < available_cores()


def kv_events_for(config: ServerConfig, index: int, name: str) -> KVEventsConfig | None:
    """Where hosted model number `index` (from 0) publishes its KV-cache events, if anywhere."""
    if config.kv_events_endpoint is None:
        return None
    return KVEventsConfig(config.kv_events_endpoint, config.kv_events_replay_endpoint, config.kv_events_topic,
                          config.kv_events_buffer_steps).for_model(index, name)


class ModelHost:
    def __init__(self, models: dict[str, HostedModel]):
        self.models = models
        self.default = next(iter(models))

    @classmethod
    def load(cls, config: ServerConfig, stop: threading.Event | None = None) -> "ModelHost":
        """Every model of `config`, loaded, its engine not yet started if it runs on a thread (`start`).
        `stop` set while loading: raises LoadCancelled before the next model, or at once while an engine
        process loads (it is ended); a load in this process runs to its end first."""
        stop = stop or threading.Event()
        models = {}
        specs = config.model_specs()
        template_files = config.chat_template_files()
        unknown = set(template_files) - {None} - {name for name, _ in specs}
        if unknown:
            raise ValueError(f"--chat-template names models that are not hosted: {', '.join(sorted(unknown))}")
        templates = {name: read_chat_template(file) for name, file in template_files.items()}
        revisions = config.model_revisions()
        try:
            for i, (name, path) in enumerate(specs, 1):
                if stop.is_set():
                    raise LoadCancelled(f"the server began to stop before {name} loaded")
                start = time.monotonic()
                at = f" at revision {revisions[name]}" if name in revisions else ""
                log.info("loading model %d/%d: %s from %s%s", i, len(specs), name, path, at)
                hosted = models[name] = cls._host(name, path, config, (i, len(specs)),
                                                  templates.get(name, templates.get(None)), revisions.get(name),
                                                  stop)
                loaded, engine = hosted.loaded, hosted.engine
                log.info(
                    "loaded %s%s: %s, %.1fM parameters, %s on %s, %.1f MiB cache reserved (%s), max_model_len %d, "
                    "in %.1fs", name, f" (commit {loaded.revision})" if loaded.revision else "",
                    loaded.architecture, loaded.num_parameters / 1e6,
                    str(loaded.dtype).removeprefix("torch."), loaded.device, engine.cache_bytes / 2**20,
                    engine.describe_cache(), hosted.max_model_len, time.monotonic() - start,
                )
                if loaded.generation_defaults:
                    log.info("%s: sampling defaults from generation_config.json: %s (--generation-config none drops "
                             "them)", name, ", ".join(f"{k}={v}" for k, v in loaded.generation_defaults.items()))
            if stop.is_set():
                raise LoadCancelled("the server began to stop while the models loaded")
        except BaseException as e:
            for hosted in models.values():  # engine processes already started stop with the failed load
                hosted.engine.shutdown()
            if isinstance(e, EngineStartCancelled):
                raise LoadCancelled(str(e)) from None
            raise
        return cls(models)

    @staticmethod
    def _host(name: str, path: str, config: ServerConfig, position: tuple[int, int],
              chat_template: str | None = None, revision: str | None = None,
              stop: threading.Event | None = None) -> HostedModel:
        """`position`: (this model's number from 1, how many are hosted); `revision`: of a hub id (None: main);
        `stop`: set, an engine process still loading is ended (EngineStartCancelled)."""
        separate = uses_engine_process(config)
        number, num_models = position
        # Models on one GPU share the fraction equally, each engine sizing its cache alone, models loaded in
        # turn. An engine process counts what the earlier processes took as "memory outside PyTorch", so its
        # budget is the shares of all models up to its own; a thread counts only its own model's weights.
        utilization = config.gpu_memory_utilization * (number if separate else 1) / num_models
        engine_config = EngineConfig(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.max_queue),
            CacheConfig(block_size=config.block_size, cache_bytes=config.cache_bytes,
                        gpu_memory_utilization=utilization, enable_prefix_caching=config.enable_prefix_caching),
            enforce_eager=config.enforce_eager,
            async_scheduling=config.async_scheduling,
            kv_events=kv_events_for(config, number - 1, name),
            parallel=ParallelConfig(config.tensor_parallel_size, config.tensor_parallel_workers),
        )
        load = dict(generation_config=config.generation_config, attention_backend=config.attention_backend,
                    layer_ops=config.layer_ops)
        if separate:
            # A branch is resolved to its commit once: looked up again in the engine process, it could have
            # moved in between, and the two processes would serve different snapshots.
            location = locate(path, revision)
            engine = ProcessEngine(CoreSpec(name, location, dict(device=config.device, dtype=config.dtype, **load),
                                            engine_config, config.threads))
            engine.start(stop)  # loads the weights there; here only what the API needs, on the device it chose
        try:
            if separate:
                loaded = load_checkpoint(location, device=engine.info.device, dtype=engine.info.dtype,
                                         weights=False, name=name, **load)
            else:
                loaded = load_engine_model(path, engine_config.parallel, device=config.device, dtype=config.dtype,
                                           name=name, revision=revision, **load)
                engine = AsyncEngine(loaded, engine_config, name=name, threads=config.threads)
            template, no_chat_reason = chat_template_for(name, loaded, chat_template)
            tool_template = tool_template_for(name, loaded, chat_template) if template is not None else None
        except BaseException:
            if separate:
                engine.shutdown()
            raise
        if loaded.max_seq_len is None:  # a fixed-size state: any length the server allows
            max_model_len = config.max_model_len or RECURRENT_MAX_MODEL_LEN
        else:
            max_model_len = min(loaded.max_seq_len, config.max_model_len or loaded.max_seq_len)
        # An engine on a thread shares the compiler, so a request's grammar is compiled once; a process has its own.
        grammars = engine.core.grammars if isinstance(engine, AsyncEngine) else GrammarCompiler(
            loaded.tokenizer, loaded.eos_token_ids, loaded.model.config.vocab_size)
        grammars.timeout_s = config.grammar_timeout
        return HostedModel(name, loaded, engine, max_model_len, int(time.time()), template, no_chat_reason,
                           tool_template, grammars)

    def start(self) -> None:
        for hosted in self.models.values():
            hosted.engine.start()

    def shutdown(self) -> None:
        for hosted in self.models.values():
            hosted.engine.shutdown()

    def get(self, name: str | None) -> HostedModel | None:
        return self.models.get(name or self.default)

    @property
    def num_active(self) -> int:
        """Requests submitted and not yet answered, over all models."""
        return sum(m.engine.num_active for m in self.models.values())

    @property
    def all_alive(self) -> bool:
        return all(m.engine.is_alive for m in self.models.values())
