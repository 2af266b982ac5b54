"""An in-process app over the tiny checkpoints of every architecture."""

from __future__ import annotations

import httpx
import pytest

from quill.server.api.app import create_app
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost
from tests.conftest import TEST_DEVICE, TINY, LiveServer  # noqa: F401  (LiveServer: used by tests importing from here)


def server_config(tiny_checkpoints, **overrides) -> ServerConfig:
    values = dict(
        models=[f"{n}={p}" for n, p in tiny_checkpoints.items()], device=str(TEST_DEVICE), dtype="float32",
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


