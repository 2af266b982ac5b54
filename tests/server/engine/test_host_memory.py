"""Freed host memory kept for reuse: a CPU engine raises glibc's thresholds, so that the same large tensors
allocated and freed step after step stop faulting their pages in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from quill.server.engine import host_memory

pytestmark = pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's malloc only (Linux)")

# Holds tensors of the sizes given (MiB; by default two dozen of 1-18 MiB, as a step's activations), then frees them,
# eight times over; reports the minor page faults of the last four rounds and what keep_freed_memory said.
PROBE = """
import json, resource, sys, torch
from quill.server.engine.host_memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
sizes = [int(mib) for mib in sys.argv[2].split(",")] if len(sys.argv) > 2 else [6, 12, 3, 18, 1, 9] * 4
for i in range(8):
    if i == 4:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.empty(mib << 18).fill_(1.0) for mib in sizes]
    del held
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "kept": kept}))
"""


def probe(mode: str, env: dict | None = None, sizes: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, *([sizes] if sizes else [])], capture_output=True,
                         text=True, check=True, env=env, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_memory_stops_the_page_faults():
    """glibc's starting mmap threshold (128 KiB), held fixed (its rise with what is freed makes a plain run's faults
    come and go between runs), faults every round's pages in again; raised, the heap serves them again."""
    plain = probe("plain", os.environ | {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)})
    kept = probe("keep")
    assert kept["kept"] is True
    assert plain["faults"] > 4 * 40_000  # each round touches 196 MiB: 50,000 pages
    assert kept["faults"] < 1_000


def test_blocks_past_the_largest_mmap_threshold_come_from_the_heap_too():
    """glibc maps blocks of more than 32 MiB apart whatever its threshold (a beam step's logits over a large
    vocabulary): with the thresholds raised as far as they go but mappings allowed, every round faults them in."""
    sizes = "60,48,60,40"
    mapped = probe("plain", os.environ | {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                                          "MALLOC_TRIM_THRESHOLD_": str((1 << 31) - 1)}, sizes)
    kept = probe("keep", sizes=sizes)
    assert kept["kept"] is True
    assert mapped["faults"] > 4 * 40_000  # each round touches 208 MiB: 53,000 pages
    assert kept["faults"] < 1_000


def test_thresholds_the_environment_sets_are_left_alone():
    assert probe("keep", os.environ | {"MALLOC_TRIM_THRESHOLD_": "131072"})["kept"] is False
    assert probe("keep", os.environ | {"MALLOC_MMAP_MAX_": "65536"})["kept"] is False


def test_an_engine_keeps_freed_memory_where_it_computes_on_the_cpu(monkeypatch, tiny_tokenizer):
    from tests.conftest import TEST_DEVICE
    from tests.server.engine.helpers import scripted_engine

    calls = []
    monkeypatch.setattr("quill.server.engine.core.keep_freed_memory", lambda: calls.append(1))
    scripted_engine(tiny_tokenizer)
    assert calls == ([1] if TEST_DEVICE.type == "cpu" else [])
