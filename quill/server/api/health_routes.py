"""Probes and the scrape endpoint: /health, /ready, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

router = APIRouter()


@router.get("/health")
async def health(http: Request):
    """Liveness: 200 while the server can serve, 503 once an engine has died (its process crashed, its loop
    broke): a restart is then what helps."""
    host = getattr(http.app.state, "host", None)
    dead = {name: m.engine.dead_reason or "not running" for name, m in host.models.items()
            if not m.engine.is_alive} if host is not None else {}
    if dead:
        return JSONResponse({"status": "engine dead", "models": dead}, status_code=503)
    return {"status": "ok"}


@router.get("/ready")
async def ready(http: Request):
    """Models loaded and every engine loop running; 503 while loading, draining, or with a dead engine."""
    state = http.app.state
    host = getattr(state, "host", None)
    if host is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    dead = [name for name, m in host.models.items() if not m.engine.is_alive]
    if dead:
        return JSONResponse({"status": "engine dead", "models": dead}, status_code=503)
    return {"status": "ready", "models": list(host.models)}


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "Prometheus text format"}})
async def metrics(http: Request):
    return Response(http.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
