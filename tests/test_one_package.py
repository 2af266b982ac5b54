"""Quill installs one import package, `quill`: no module of the project imports the names its parts had at the top
level before (`models`, `server`, `clients`, which any other package of those names would shadow or be shadowed by),
and the wheel holds `quill` alone."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BARE_NAMES = {"models", "server", "clients"}


def imported_top_names(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file, function-level imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def test_no_module_imports_a_bare_top_level_name():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    files = [REPO / f for f in tracked.stdout.split()]
    assert any(f.parts[-3:] == ("quill", "server", "serve.py") for f in files)  # the listing holds the package
    offenders = {str(f.relative_to(REPO)): sorted(imported_top_names(f) & BARE_NAMES) for f in files}
    assert {f: names for f, names in offenders.items() if names} == {}


def test_the_wheel_holds_the_quill_package_alone(tmp_path):
    # built from a copy of the tracked files: a build in the checkout would leave build/ behind, whose stale
    # modules a later build could package
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in tracked.stdout.split():
        if (REPO / name).is_file() and not name.startswith(("tests/", "benchmarks/results/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("quill-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"quill"}
    # what the server needs besides code comes with it: the bundled checkpoints, the playground page, the source
    # of the CPU's C++ kernels (built on the machine that runs them)
    assert any(n.startswith("quill/models/checkpoints/shakespeare-lstm/") for n in names)
    assert "quill/server/api/playground/playground.js" in names
    assert "quill/models/attention/cpu_paged_decode.cpp" in names
    assert "quill/models/kernels/cpu_state_steps.cpp" in names
