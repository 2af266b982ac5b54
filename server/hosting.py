"""The models a server hosts: each loaded once, with its own engine loop and its chat template."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from models.chat_template import ChatTemplate, ChatTemplateError
from models.checkpoint import LoadedModel, load_checkpoint

from .config import ServerConfig
from .engine.async_engine import AsyncEngine
from .engine.core import CacheConfig, EngineConfig
from .engine.scheduler import SchedulerConfig

log = logging.getLogger("quill.server")

RECURRENT_MAX_MODEL_LEN = 4096  # no attention window: bounded only so one request cannot run forever


@dataclass
class HostedModel:
    name: str
    loaded: LoadedModel
    engine: AsyncEngine
    max_model_len: int
    created: int  # unix time, for /v1/models
    chat_template: ChatTemplate | None = None  # None: /v1/chat/completions answers 400 with `no_chat_reason`
    no_chat_reason: str = ""

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


def _cache_holds(state) -> str:
    """What a model's cache holds, for the startup log."""
    if state.kind != "paged_kv":
        return f"{state.num_slots} state slots"
    return (f"{state.num_blocks * state.block_size} tokens of K,V in blocks of {state.block_size}, "
            f"attention {state.attention.name}")


class ModelHost:
    def __init__(self, models: dict[str, HostedModel]):
        self.models = models
        self.default = next(iter(models))

    @classmethod
    def load(cls, config: ServerConfig) -> "ModelHost":
        models = {}
        specs = config.model_specs()
        template_files = config.chat_template_files()
        unknown = set(template_files) - {None} - {name for name, _ in specs}
        if unknown:
            raise ValueError(f"--chat-template names models that are not hosted: {', '.join(sorted(unknown))}")
        templates = {name: read_chat_template(file) for name, file in template_files.items()}
        for i, (name, path) in enumerate(specs, 1):
            start = time.monotonic()
            log.info("loading model %d/%d: %s from %s", i, len(specs), name, path)
            loaded = load_checkpoint(path, device=config.device, dtype=config.dtype, name=name,
                                     generation_config=config.generation_config,
                                     attention_backend=config.attention_backend, layer_ops=config.layer_ops)
            models[name] = cls._host(name, loaded, config, len(specs), templates.get(name, templates.get(None)))
            engine = models[name].engine
            log.info(
                "loaded %s: %s, %.1fM parameters, %s on %s, %.1f MiB cache reserved (%s), max_model_len %d, in %.1fs",
                name, loaded.architecture, loaded.num_parameters / 1e6, str(loaded.dtype).removeprefix("torch."),
                loaded.device, engine.core.cache_bytes / 2**20, _cache_holds(engine.core.state),
                models[name].max_model_len, time.monotonic() - start,
            )
            if loaded.generation_defaults:
                log.info("%s: sampling defaults from generation_config.json: %s (--generation-config none drops them)",
                         name, ", ".join(f"{k}={v}" for k, v in loaded.generation_defaults.items()))
        return cls(models)

    @staticmethod
    def _host(name: str, loaded: LoadedModel, config: ServerConfig, num_models: int,
              chat_template: str | None = None) -> HostedModel:
        engine_config = EngineConfig(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.max_queue),
            CacheConfig(block_size=config.block_size, cache_bytes=config.cache_bytes,
                        # Models on one GPU share the fraction equally: each engine sizes its cache alone.
                        gpu_memory_utilization=config.gpu_memory_utilization / num_models,
                        enable_prefix_caching=config.enable_prefix_caching),
            enforce_eager=config.enforce_eager,
            async_scheduling=config.async_scheduling,
        )
        limit = loaded.max_seq_len or RECURRENT_MAX_MODEL_LEN
        max_model_len = min(limit, config.max_model_len) if config.max_model_len else limit
        template, no_chat_reason = chat_template_for(name, loaded, chat_template)
        engine = AsyncEngine(loaded, engine_config, name=name, threads=config.threads)
        return HostedModel(name, loaded, engine, max_model_len, int(time.time()), template, no_chat_reason)

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
