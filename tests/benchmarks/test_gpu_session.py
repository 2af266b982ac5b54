"""benchmarks/gpu_session.sh on the CPU: every stage runs in order and leaves the files a GPU run commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_whole_session_runs_on_the_cpu_and_writes_every_file(tmp_path):
    out = tmp_path / "gpu"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUILL_")} | dict(
        OUT=str(out), DEVICE="cpu", DTYPE="float32", BENCH_ARGS="--smoke", SHAPES="gpt2", PARTS="engine http",
        PYTHON=sys.executable, WHEELS=str(tmp_path / "no-wheels"), BUDGET="300",
        # one small file a stage: the selection is the script's, the order and the files are what is tested
        KERNEL_TESTS="tests/models/kernels/test_kernel_globals.py",
        ENGINE_TESTS="tests/server/engine/test_table_edits.py", API_TESTS="tests/server/test_config.py",
    )
    run = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    stages = [line.split(" (")[0] for line in run.stdout.splitlines() if line.startswith("== ") and "(at most" in line]
    assert stages == ["== tests-kernels", "== tests-engine", "== tests-api", "== gpt2"]
    assert "python" in (out / "versions.txt").read_text()
    for name in ("kernels", "engine", "api"):
        suite = ET.parse(out / f"tests-{name}.xml").getroot().find("testsuite")
        assert int(suite.get("tests")) > 0 and suite.get("failures") == suite.get("errors") == "0", name
    summary = (out / "tests-summary.txt").read_text()
    assert [line for line in summary.splitlines() if line.startswith("tests-")] == \
        ["tests-kernels:", "tests-engine:", "tests-api:"] and summary.count(" passed") == 3
    results = json.loads((out / "gpu_bench-gpt2.json").read_text())
    assert results["shapes"]["gpt2"]["errors"] == {} and results["shapes"]["gpt2"]["http"]["num_ok"] > 0
    assert "Quill over HTTP" in (out / "gpu_table.md").read_text()


def test_a_packed_session_leaves_its_files_in_one_archive(tmp_path):
    """PACK=1: the device tool brings back at most 8 files, so everything goes into one archive beside the summary."""
    out = tmp_path / "gpu"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUILL_")} | dict(
        OUT=str(out), DEVICE="cpu", STAGES="custom", TESTS="tests/server/engine/test_table_edits.py", PACK="1",
        PYTHON=sys.executable, WHEELS=str(tmp_path / "no-wheels"), BUDGET="120",
    )
    run = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["session.tar.gz", "tests-summary.txt", "versions.txt"]
    with tarfile.open(out / "session.tar.gz") as archive:
        names = {Path(name).name for name in archive.getnames()}
        suite = ET.parse(archive.extractfile("./tests-custom.xml")).getroot().find("testsuite")
    assert {"tests-custom.log", "tests-custom.xml", "tests-summary.txt", "versions.txt"} <= names
    assert int(suite.get("tests")) > 0 and suite.get("failures") == suite.get("errors") == "0"


def test_the_seq2seq_stage_leaves_its_table_and_deletes_its_models(tmp_path):
    out = tmp_path / "gpu"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUILL_")} | dict(
        OUT=str(out), DEVICE="cpu", DTYPE="float32", STAGES="seq2seq", PACK="1",
        SEQ2SEQ_ARGS="--smoke --engines transformers,quill --beams 1",
        PYTHON=sys.executable, WHEELS=str(tmp_path / "no-wheels"), BUDGET="200",
    )
    run = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=260)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["seq2seq.txt", "session.tar.gz", "versions.txt"]
    table = (out / "seq2seq.txt").read_text()
    assert table.startswith("Seq2seq benchmark (smoke)") and "same output, quill text vs transformers: 6 of 6" in table
    with tarfile.open(out / "session.tar.gz") as archive:
        names = archive.getnames()
        results = json.load(archive.extractfile("./seq2seq.json"))
    assert not any("seq2seq-models" in name for name in names)
    assert results["quill"]["ran"] and results["offline"]["quill"]["1"]["tokens_per_s"] > 0
