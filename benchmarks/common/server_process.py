"""`quill serve` in a child process on a free loopback port: started, waited for until ready, stopped.

The server is the real one, started the way a user starts it; its settings come from a
`ServerConfig`, so an in-process engine can be built from the very same object. Further flags
(`extra_args`) go to the server as they are, after being read into that object by the server's own
parser, so both sides see them. Its output goes to a temporary file (a chatty server never blocks
on a full pipe) and is shown if it fails to start.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import IO

from quill.clients.ready import wait_until_ready
from quill.server.config import ServerConfig, add_serve_arguments, config_from_args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(config: ServerConfig) -> list[str]:
    """`python -m quill.cli serve` with the flags that set what `config` sets."""
    args = [sys.executable, "-m", "quill.cli", "serve", "--host", config.host, "--port", str(config.port),
            "--device", config.device, "--dtype", config.dtype, "--max-num-seqs", str(config.max_num_seqs),
            "--max-num-batched-tokens", str(config.max_num_batched_tokens), "--max-queue", str(config.max_queue),
            "--block-size", str(config.block_size), "--max-tokens-limit", str(config.max_tokens_limit)]
    if config.cache_bytes is not None:  # else sized from the GPU (--gpu-memory-utilization), or the default
        args += ["--cache-bytes", str(config.cache_bytes)]
    for spec in config.models:
        args += ["--model", spec]
    if not config.enable_prefix_caching:
        args.append("--no-prefix-caching")
    for flag, value in (("--loop", config.loop), ("--http", config.http)):
        if value != "auto":
            args += [flag, value]
    if config.engine_process is not None:
        args.append("--engine-process" if config.engine_process else "--no-engine-process")
    return args


@contextmanager
def _without_quill_env() -> Iterator[None]:
    """QUILL_* variables hidden: they are the server parser's defaults, and the server never sees them."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("QUILL_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def with_serve_args(config: ServerConfig, extra_args: list[str]) -> ServerConfig:
    """`config` with `quill serve` flags applied on top (later flags win, as on the command line).

    A flag this server does not know is an error here, before any model loads."""
    if not extra_args:
        return config
    with _without_quill_env():
        parser = argparse.ArgumentParser(prog="quill serve", exit_on_error=False)
        add_serve_arguments(parser)
    try:
        args, unknown = parser.parse_known_args(serve_command(config)[4:] + list(extra_args))
    except argparse.ArgumentError as e:
        raise ValueError(f"server arguments {extra_args}: {e}") from None
    if unknown:
        raise ValueError(f"quill serve has no flag {' '.join(unknown)}")
    return config_from_args(args)


def stop_process(process: subprocess.Popen, group: bool = False) -> None:
    """SIGTERM (a server drains: nothing is in flight by now, so it exits at once), SIGKILL after a minute.
    `group`: to the process's whole group (one started with start_new_session, whose children serve too)."""
    if process.poll() is not None:
        return
    send = (lambda sig: os.killpg(process.pid, sig)) if group else process.send_signal
    send(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()


@contextmanager
def running_server(config: ServerConfig, ready_timeout: float, threads: int | None = None,
                   extra_args: list[str] = ()) -> Iterator[str]:
    """Yields the server's URL once /ready answers 200; stops the server on the way out (see `server_process`)."""
    with server_process(config, ready_timeout, threads, extra_args) as (url, _):
        yield url


@contextmanager
def server_process(config: ServerConfig, ready_timeout: float, threads: int | None = None,
                   extra_args: list[str] = (), output: IO[str] | None = None,
                   ) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yields the server's URL and process once /ready answers 200; stops the server on the way out.

    QUILL_* variables of this environment are not passed on: flags set everything, and a stray
    QUILL_API_KEY would lock the benchmark's own requests out. `threads` sets OMP_NUM_THREADS;
    `extra_args` are appended to the command (see `with_serve_args`); the server's output goes to `output`
    (a file opened "w+"), else to a temporary file.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUILL_")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    url = f"http://{config.host}:{config.port}"
    with nullcontext(output) if output is not None else tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(serve_command(config) + list(extra_args), stdout=log, stderr=subprocess.STDOUT,
                                   text=True, env=env)
        try:
            try:
                wait_until_ready(url, ready_timeout, interval=0.2, still_starting=lambda: process.poll() is None)
            except (RuntimeError, TimeoutError) as e:
                stop_process(process)
                log.seek(0)
                raise RuntimeError(f"{e}; its output:\n{log.read()[-4000:]}") from None
            yield url, process
        finally:
            stop_process(process)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux's /proc; None elsewhere or once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (an engine process of the server's), from Linux's /proc; [] elsewhere."""
    children = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return children
