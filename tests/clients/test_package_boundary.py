"""`quill/clients/` is a client package: all of it imports with the server, the models, torch, transformers and the
benchmarks made unimportable, so a user of the client and of `quill bench` needs none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("quill.server", "quill.models", "torch", "transformers", "benchmarks")

# Imports every module under quill/clients/ in a fresh interpreter whose import system refuses BLOCKED.
IMPORT_ALL = """
import importlib, pkgutil, sys

blocked = set(sys.argv[1].split(","))


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(f"{name} is not for the client package")
        return None


sys.meta_path.insert(0, Refuse())
import quill.clients

names = [m.name for m in pkgutil.walk_packages(quill.clients.__path__, "quill.clients.")]
for name in names:
    importlib.import_module(name)
print("\\n".join(names))
"""


def test_every_client_module_imports_without_server_models_torch_or_transformers():
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, ",".join(BLOCKED)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(done.stdout.split())
    assert {f"quill.clients.{name}" for name in ("client", "cli", "bench.cli", "bench.runner", "bench.workload",
                                                 "bench.plots", "bench.context_sweep")} <= imported
