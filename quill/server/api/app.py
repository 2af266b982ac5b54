"""The FastAPI application: routes of both dialects, probes, metrics, guards."""

from __future__ import annotations

from fastapi import FastAPI

from quill.server import __version__
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost

from . import health_routes, playground_routes, structured_routes
from .cache_config_info import cache_config_labels
from .openai import chat, completions, tokenize, tokenizer_info
from .tgi import routes as tgi
from .libretranslate import routes as libretranslate
from .errors import APIError, install_error_handlers, is_openai_path
from .guards import RequestGuard
from .metrics import Metrics


def create_app(host: ModelHost | None, config: ServerConfig, metrics: Metrics | None = None) -> FastAPI:
    """`host` may be None while models load (then /ready answers 503); attach it with `attach_host`."""
    app = FastAPI(title="Quill", version=__version__,
                  description="Text generation for LSTM, gated-CNN, Transformer and state-space language models")
    app.state.config = config
    app.state.metrics = metrics or Metrics()
    app.state.draining = False
    app.state.host = None

    def count_error(request_or_path, error: APIError | int) -> None:
        host_ = app.state.host
        path = request_or_path if isinstance(request_or_path, str) else request_or_path.url.path
        status = error if isinstance(error, int) else error.status
        reason = str(status) if isinstance(error, int) else error.reason
        model = host_.default if host_ is not None else "none"
        if path.startswith("/v1/") or path in ("/", "/generate", "/generate_stream"):
            app.state.metrics.request_errors.labels(model=model, reason=reason).inc()

    install_error_handlers(app, on_error=count_error)
    app.add_middleware(RequestGuard, max_body_bytes=config.max_body_bytes, api_keys=config.api_keys,
                       on_reject=count_error, body_timeout=config.body_timeout)

    app.include_router(health_routes.router)
    app.include_router(completions.router)
    app.include_router(chat.router)
    app.include_router(tokenize.router)
    app.include_router(tokenizer_info.router)
    app.include_router(tgi.router)
    app.include_router(structured_routes.router)
    app.include_router(playground_routes.router)
    app.include_router(libretranslate.router)
    if host is not None:
        attach_host(app, host)
    return app


def attach_host(app: FastAPI, host: ModelHost) -> None:
    app.state.host = host
    for name, hosted in host.models.items():
        app.state.metrics.init_model(name)
        app.state.metrics.set_cache_config(name, cache_config_labels(hosted.engine))
        hosted.engine.on_stats = lambda stats, name=name: app.state.metrics.engine_step(name, stats)


__all__ = ["create_app", "attach_host", "is_openai_path"]
