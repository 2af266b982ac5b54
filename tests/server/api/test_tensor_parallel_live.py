"""A real server with its model split 2 ways (`--tensor-parallel-size 2`, gloo on the CPU) answers; once its other
rank dies, a request fails with 503 saying so and the server exits with ENGINES_DEAD_EXIT_CODE for a restart. (The
engine on a thread: a process of its own adds a start to the test, and handles a lost device in code other tests
cover.)"""

from __future__ import annotations

import os
import re
import signal

import httpx
import pytest

from quill.server.serve import ENGINES_DEAD_EXIT_CODE
from tests.conftest import LiveServer
from tests.parallel_checkpoints import write_checkpoint

pytest.importorskip("transformers")


def test_a_split_model_serves_and_a_lost_rank_stops_the_server_for_a_restart(tmp_path):
    server = LiveServer({"llama": str(write_checkpoint("llama", tmp_path / "llama"))}, "--no-engine-process",
                        "--tensor-parallel-size", "2", "--device", "cpu")
    try:
        server.wait_ready()
        served = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=30)
        rank = int(re.search(r"tensor-parallel rank 1: process (\d+)", server.output()).group(1))
        os.kill(rank, signal.SIGKILL)
        lost = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=30)
        returncode = server.exit_code(timeout=30)
    finally:
        output = server.stop()
    assert served.status_code == 200, served.text
    assert lost.status_code == 503, lost.text
    assert "tensor-parallel group of 2 ranks is lost" in lost.json()["error"]["message"]
    assert returncode == ENGINES_DEAD_EXIT_CODE, output
