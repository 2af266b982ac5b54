"""The house's rules that a reader relies on: no source file outside the tests grows past 400 lines, and the
benchmarks' folder holds at its top only what runs (`python -m benchmarks.<name>`), their shared parts in
benchmarks/common/, which runs nothing."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def tracked(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / name for name in out.split() if (REPO / name).is_file()]


def runs(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def test_no_source_file_outside_the_tests_is_over_400_lines():
    sources = [p for p in tracked("*.py") if p.relative_to(REPO).parts[0] != "tests"]
    assert any(p.name == "model_runner.py" for p in sources)
    long = {str(p.relative_to(REPO)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_benchmarks_top_runs_and_their_common_parts_do_not():
    top = [p for p in tracked("benchmarks/*.py") if p.parent.name == "benchmarks" and p.name != "__init__.py"]
    common = [p for p in tracked("benchmarks/common/*.py") if p.name != "__init__.py"]
    assert len(top) > 10 and len(common) > 10
    assert [p.name for p in top if not runs(p)] == []
    assert [p.name for p in common if runs(p)] == []


def test_the_server_uses_the_engine_through_its_public_face():
    """Outside quill/server/engine/, the package imports the engine as `quill.server.engine` (its __init__: what
    routes, hosting and the command line may use), never one of its modules."""
    offenders = []
    for path in tracked("quill/*.py"):  # git matches the pattern across folders
        relative = path.relative_to(REPO)
        if relative.parts[:3] == ("quill", "server", "engine"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                absolute = node.module if node.level == 0 else None
                if node.level and relative.parts[:2] == ("quill", "server"):
                    base = list(relative.parent.parts)[: len(relative.parent.parts) - node.level + 1]
                    absolute = ".".join(base + [node.module])
                if absolute and absolute.startswith("quill.server.engine."):
                    offenders.append(f"{relative}: {absolute}")
    assert offenders == []
