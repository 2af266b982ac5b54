"""No import circle anywhere in the project (the package, the benchmarks, the tests): every module's imports,
those inside functions included (a circle hidden in a function is still a circle), form a graph without cycles.
Importing `a.b.c` also imports the packages `a` and `a.b`, so those count as edges too."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def project_modules() -> dict[str, Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    modules = {}
    for name in tracked.stdout.split():
        parts = Path(name).with_suffix("").parts
        if parts[0] in ("quill", "benchmarks", "tests"):
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = REPO / name
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `module` imports, relative imports resolved, `from package import name` counted as the
    submodule where `name` is one."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            named += [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for name in named:
        while name and name not in modules:  # `from x import a_function`: the module x
            name = name.rpartition(".")[0]
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()  # its packages too
    return {m for m in found if m != module and not module.startswith(m + ".")}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_project():
    modules = project_modules()
    assert "quill.server.engine.core" in modules and "tests.conftest" in modules
    graph = {m: imports_of(m, path, modules) for m, path in modules.items()}
    assert "quill.models.loading.location" in graph["quill.models.loading.checkpoint"]  # edges are read
    assert cycles(graph) == []
