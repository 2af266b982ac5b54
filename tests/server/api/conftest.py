"""Tiny checkpoints of every architecture, an in-process app over them, and a real server process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch

from models.checkpoint import save_checkpoint
from server.api.app import create_app
from server.config import ServerConfig
from server.hosting import ModelHost
from tests.conftest import build_tiny_model

TINY = {"tiny-transformer": "transformer-gpt2", "tiny-lstm": "lstm", "tiny-gcnn": "gcnn"}


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_tokenizer) -> dict[str, str]:
    root = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for name, key in TINY.items():
        arch, model = build_tiny_model(key, tiny_tokenizer.vocab_size)
        with torch.no_grad():
            model.embed.weight.mul_(0.5)
        paths[name] = str(save_checkpoint(root / name, arch, model, tiny_tokenizer, dtype=torch.float32))
    return paths


def server_config(tiny_checkpoints, **overrides) -> ServerConfig:
    values = dict(
        models=[f"{n}={p}" for n, p in tiny_checkpoints.items()], device="cpu", dtype="float32",
        max_num_seqs=16, max_queue=32, cache_bytes=4 * 2**20, block_size=4, max_tokens_limit=256,
        max_model_len=None, drain_seconds=5.0,
    )
    values.update(overrides)
    return ServerConfig(**values)


@pytest.fixture(scope="module")
def app(tiny_checkpoints):
    config = server_config(tiny_checkpoints)
    host = ModelHost.load(config)
    host.start()
    application = create_app(host, config)
    yield application
    host.shutdown()


@pytest.fixture
async def client(app):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://quill.test", timeout=30) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`quill serve` in a subprocess on a loopback port."""

    def __init__(self, tiny_checkpoints, *extra: str, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--device", "cpu", "--dtype", "float32", "--cache-bytes", str(4 * 2**20), "--block-size", "4",
                "--max-tokens-limit", "256", "--drain-seconds", "5"]
        for name, path in tiny_checkpoints.items():
            args += ["--model", f"{name}={path}"]
        self.process = subprocess.Popen(
            args + list(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})},
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.process.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server not ready")

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.stdout.read()


@pytest.fixture(scope="module")
def live_server(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
