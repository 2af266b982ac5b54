"""The soak test's short form: mixed traffic with clients walking away, then nothing left behind."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.soak import soak
from tests.conftest import LiveServer


def test_short_soak_leaves_nothing_behind(tiny_checkpoints):
    server = LiveServer(tiny_checkpoints, "--max-num-seqs", "16")
    server.wait_ready()
    try:
        result = asyncio.run(soak(server.url, num_requests=160, concurrency=16, disconnect_fraction=0.2, seed=1,
                                  max_seconds=90, server_pid=server.process.pid))
    finally:
        log = server.stop()
    assert result.requests == 160
    assert result.server_5xx == 0 and result.malformed == 0, result
    # Who leaves is the seed's choice; whether a leaver's answer ended first is the machine's speed, except for
    # streams left after their first event (a fast server merges tokens into fewer events, a slow one answers late)
    assert result.leavers > 20 and result.completed > 80
    assert result.sure_leavers <= result.disconnected <= result.leavers and result.sure_leavers >= 2
    assert all(v == 0 for v in result.leftover.values()), result.leftover
    assert result.rss_after_mib < result.rss_before_mib + 200  # bounded: no per-request growth worth the name
    assert "Traceback" not in log


def test_soak_refuses_remote_targets():
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(soak("http://10.0.0.1:8000", 1, 1, 0.0, 0, 1))
