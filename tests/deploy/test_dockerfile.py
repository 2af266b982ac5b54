"""The Dockerfile, checked without a Docker engine: it parses, every stage it names exists for both
variants, every COPY source exists and survives .dockerignore, every command it runs exists where it
runs, and the image runs `quill serve` as a non-root PID 1 with a /health check. Then hadolint."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO, quill_env_vars, quill_serve_parser, require_tool

VARIANTS = ("cpu", "cuda")
# What each external base image brings that the Dockerfile runs (both are Debian-family images:
# coreutils, passwd's useradd/groupadd, apt-get; the Python image has python3 on PATH).
BASE_IMAGE_COMMANDS = {
    "python:": {"apt-get", "rm", "mkdir", "chown", "groupadd", "useradd", "python3"},
    "nvidia/cuda:": {"apt-get", "rm", "mkdir", "chown", "groupadd", "useradd"},
}
APT_PACKAGE_COMMANDS = {"python3": {"python3"}, "python3-venv": set(), "g++": {"g++"}}


# ---- a small Dockerfile parser -------------------------------------------------------------------

@dataclass
class Instruction:
    keyword: str
    value: str
    line: int

    def flags_and_args(self) -> tuple[dict[str, str], str]:
        flags, rest = {}, self.value
        while m := re.match(r"--([a-z-]+)(?:=(\S+))?\s+", rest):
            flags[m.group(1)] = m.group(2) or ""
            rest = rest[m.end():]
        return flags, rest

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form ENTRYPOINT/CMD/HEALTHCHECK CMD, or None for the shell form."""
        try:
            value = json.loads(self.value)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Comments and line continuations as Docker reads them."""
    instructions, buffer, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#") or (not line and not buffer):
            continue  # comments (and parser directives) are dropped, even inside a continued instruction
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1].rstrip() + " "
            continue
        buffer += line
        keyword, _, value = buffer.strip().partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip(), start))
        buffer = ""
    assert not buffer, "the Dockerfile ends inside a continued line"

    global_args, stages = {}, []
    for ins in instructions:
        if ins.keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", ins.value, re.IGNORECASE)
            assert m, f"line {ins.line}: cannot read FROM {ins.value}"
            stages.append(Stage(m.group(1), m.group(2)))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may come before the first FROM"
            name, _, default = ins.value.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


def substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], value)


# ---- .dockerignore, as Docker's pattern matcher reads it ------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1:end]
            out += "[" + ("^" + body[1:] if body[:1] in "!^" and body else body) + "]"
            i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def read_dockerignore(text: str) -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        rules.append((negate, _pattern_regex(pattern.strip("/"))))
    return rules


def is_ignored(path: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """A path is left out when the last rule matching it, or one of its parent folders, excludes it."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for negate, regex in rules:
        if any(regex.match(c) for c in candidates):
            ignored = not negate
    return ignored


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile((REPO / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def ignore_rules():
    return read_dockerignore((REPO / ".dockerignore").read_text())


def stages_for(dockerfile, variant: str) -> dict[str, tuple[str, Stage]]:
    """name -> (resolved base, stage), with VARIANT set."""
    global_args, stages = dockerfile
    args = {**global_args, "VARIANT": variant}
    return {s.name: (substitute(s.base, args), s) for s in stages}


def needed_stages(dockerfile, variant: str) -> list[str]:
    """The stages BuildKit builds for the final one, dependencies first."""
    by_name = stages_for(dockerfile, variant)
    order: list[str] = []

    def visit(name: str) -> None:
        base, stage = by_name[name]
        deps = [base] if base in by_name else []
        deps += [i.flags_and_args()[0]["from"] for i in stage.all("COPY") if "from" in i.flags_and_args()[0]]
        for dep in deps:
            assert dep in by_name, f"stage {name} uses {dep}, which is no stage of the Dockerfile"
            if dep not in order:
                visit(dep)
        order.append(name)

    visit(dockerfile[1][-1].name)
    return order


# ---- the parser and the matcher themselves ----------------------------------------------------

def test_parser_reads_continuations_and_comments():
    _, stages = parse_dockerfile("ARG A=1\nFROM x:1 AS one\n# c\nRUN a \\\n  # inside\n  && b\nUSER 5\n")
    assert stages[0].name == "one" and [i.keyword for i in stages[0].instructions] == ["RUN", "USER"]
    assert stages[0].instructions[0].value == "a && b"


def test_dockerignore_matcher():
    rules = read_dockerignore("data\n**/__pycache__\n*.egg-info\n!keep.egg-info\n")
    assert is_ignored("data/x/y.txt", rules) and is_ignored("data", rules)
    assert is_ignored("quill/server/api/__pycache__/a.pyc", rules) and is_ignored("__pycache__/a.pyc", rules)
    assert is_ignored("quill.egg-info/PKG-INFO", rules) and not is_ignored("keep.egg-info", rules)
    assert not is_ignored("quill/models/data.py", rules) and not is_ignored("sub/data", rules)


# ---- the Dockerfile -------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_every_stage_resolves(dockerfile, variant):
    by_name = stages_for(dockerfile, variant)
    assert dockerfile[1][-1].name == "runtime"
    for name in needed_stages(dockerfile, variant):
        base, _ = by_name[name]
        if base not in by_name:  # an image from a registry: pinned to a tag, never "latest"
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", base) and not base.endswith(":latest"), base
            assert any(base.startswith(prefix) for prefix in BASE_IMAGE_COMMANDS), f"unknown base image {base}"
    assert f"base-{variant}" in needed_stages(dockerfile, variant)
    assert f"torch-{variant}" in needed_stages(dockerfile, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_command_run_exists_in_its_stage(dockerfile, variant):
    by_name = stages_for(dockerfile, variant)
    available: dict[str, set[str]] = {}
    for name in needed_stages(dockerfile, variant):
        base, stage = by_name[name]
        if base in available:
            have = set(available[base])
        else:
            have = next(set(cmds) for prefix, cmds in BASE_IMAGE_COMMANDS.items() if base.startswith(prefix))
        for run in stage.all("RUN"):
            for command in re.split(r"&&|\|\||;", run.value):
                words = shlex.split(command)
                assert words[0] in have, f"stage {name}: `{words[0]}` is not in the image at that point"
                if words[:2] == ["apt-get", "install"]:
                    for package in (w for w in words[2:] if not w.startswith("-")):
                        have |= APT_PACKAGE_COMMANDS[package]
                if words[1:3] == ["-m", "venv"]:
                    have |= {f"{words[3]}/bin/pip", f"{words[3]}/bin/python"}
        available[name] = have


def test_copy_sources_exist_and_are_in_the_build_context(dockerfile, ignore_rules):
    _, stages = dockerfile
    names = {s.name for s in stages}
    copies = [i for s in stages for i in s.all("COPY") + s.all("ADD")]
    assert copies
    for ins in copies:
        assert ins.keyword == "COPY", f"line {ins.line}: ADD fetches and unpacks; COPY says what it does"
        flags, rest = ins.flags_and_args()
        if "from" in flags:
            assert flags["from"] in names, f"line {ins.line}: no stage {flags['from']}"
            continue
        *sources, _dest = shlex.split(rest)
        for source in sources:
            assert (REPO / source).exists(), f"line {ins.line}: {source} does not exist"
            assert not is_ignored(source, ignore_rules), f"line {ins.line}: .dockerignore leaves out {source}"


def test_the_package_and_its_checkpoints_are_copied(dockerfile, ignore_rules):
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {Path(s).parts[0] for st in dockerfile[1] for i in st.all("COPY") if "from" not in i.flags_and_args()[0]
              for s in shlex.split(i.flags_and_args()[1])[:-1]}
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    assert "checkpoints/*/*" in pyproject["tool"]["setuptools"]["package-data"]["quill.models"]
    bundled = [p for p in (REPO / "quill" / "models" / "checkpoints").glob("*/*") if p.is_file()]
    assert bundled, "no bundled checkpoint to put in the image"
    for path in bundled:
        assert not is_ignored(str(path.relative_to(REPO)), ignore_rules), path


def test_dockerignore_keeps_the_context_small(ignore_rules):
    for path in (".venv/bin/python", "data/corpus.txt", "runs/x/log", ".git/HEAD", ".pytest_cache/v",
                 ".hypothesis/examples", "quill/server/__pycache__/app.cpython-311.pyc", "quill.egg-info/PKG-INFO"):
        assert is_ignored(path, ignore_rules), path


def test_torch_is_pinned_from_a_per_variant_index(dockerfile):
    makefile_pin = re.search(r"TORCH_SPEC\s*\?=\s*torch==(\S+)", (REPO / "Makefile").read_text()).group(1)
    by_name = {s.name: s for s in dockerfile[1]}
    for variant in VARIANTS:
        args = dict(i.value.partition("=")[::2] for i in by_name[f"torch-{variant}"].all("ARG"))
        assert args["TORCH_VERSION"] == makefile_pin
        wheel_kind = args["TORCH_INDEX_URL"].rsplit("/", 1)[1]
        assert wheel_kind == "cpu" if variant == "cpu" else re.fullmatch(r"cu\d{3}", wheel_kind), wheel_kind
        run = " ".join(i.value for i in by_name[f"torch-{variant}"].all("RUN"))
        assert '"torch==${TORCH_VERSION}"' in run and '--index-url "${TORCH_INDEX_URL}"' in run


def test_runtime_runs_quill_serve_as_non_root_pid_1(dockerfile):
    runtime = dockerfile[1][-1]
    users = runtime.all("USER")
    assert users, "the runtime stage sets no USER: it would run as root"
    user = users[-1].value.split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), "a numeric non-root user (Kubernetes runAsNonRoot checks it)"
    run = " ".join(i.value for i in runtime.all("RUN"))
    assert f"--uid {user}" in run

    entrypoint, cmd = runtime.all("ENTRYPOINT")[-1].exec_form(), runtime.all("CMD")[-1].exec_form()
    assert entrypoint is not None and cmd is not None, "exec form: the server is PID 1 and receives SIGTERM"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint[0] in scripts and entrypoint[1] == "serve"
    quill_serve_parser().parse_args(entrypoint[2:] + cmd)
    assert not runtime.all("STOPSIGNAL") or runtime.all("STOPSIGNAL")[-1].value == "SIGTERM"


def test_runtime_healthcheck_and_environment(dockerfile):
    runtime = dockerfile[1][-1]
    checks = runtime.all("HEALTHCHECK")
    assert len(checks) == 1
    _flags, rest = checks[0].flags_and_args()
    assert rest.startswith("CMD ")
    probe = Instruction("CMD", rest[4:], checks[0].line).exec_form()
    assert probe is not None and "/health" in probe[-1]
    compile(probe[-1], "healthcheck", "exec")  # the python3 -c program is valid Python

    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(i.value for i in runtime.all("ENV"))))
    quill_vars = {k for k in env if k.startswith("QUILL_")}
    assert quill_vars <= quill_env_vars(), quill_vars - quill_env_vars()
    assert env["QUILL_HOST"] == "0.0.0.0"
    assert runtime.all("EXPOSE")[-1].value == env["QUILL_PORT"] and f"'{env['QUILL_PORT']}'" in probe[-1]
    assert env["PATH"].startswith("/opt/venv/bin")


def test_hadolint():
    hadolint = require_tool("hadolint")
    result = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
