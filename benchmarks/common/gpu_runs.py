"""What gpu_bench's parts share: the results file rewritten after every figure (`Recorder`), how a run is done
(`RunOptions`), and one shape's run (`ShapeRun`: the model, the workload, the server's settings)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from quill.clients.bench.workload import BenchRequest, TargetModel, WorkloadSpec, build_requests
from quill.models.loading.checkpoint import LoadedModel
from quill.server.config import ServerConfig

from .gpu_settings import GpuBenchSettings, Shape
from .tokenized import TokenizedRequest, tokenize


class Recorder:
    """The results dict, written to its file whole after every change (a stopped run keeps what it had), each
    shape's summary (`summarize`: its figures -> the summary) made afresh first."""

    def __init__(self, results: dict, path: Path | None, summarize: Callable[[dict], dict]):
        self.results, self.path, self.summarize = results, path, summarize

    def save(self) -> None:
        for shape in self.results["shapes"].values():
            shape["summary"] = self.summarize(shape)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.results, indent=2) + "\n")
        os.replace(partial, self.path)  # atomic: a reader never sees half a file


@dataclass
class RunOptions:
    """How the run is done, beside what it measures (the settings)."""

    server_args: list[str] = field(default_factory=list)  # `quill serve` flags, for the server and the engine
    hf_batch_sizes: dict[str, int] = field(default_factory=dict)  # shape -> static batch size; else the shape's
    tmp_dir: str | None = None  # where checkpoints are written; None: the system's temporary directory
    trace_dir: Path | None = None  # where the profile part keeps its traces; None: nowhere
    progress: bool = False  # a progress bar for the HTTP run
    log: Callable[[str], None] = print


@dataclass
class ShapeRun:
    """What the parts of one shape share: the model Quill loaded, the requests, the server's settings."""

    name: str
    shape: Shape
    settings: GpuBenchSettings
    options: RunOptions
    loaded: LoadedModel
    requests: list[BenchRequest]  # the timed workload, as sent over HTTP
    warm: list[BenchRequest]  # untimed warm-up requests on other prompts
    server: ServerConfig
    recorder: Recorder
    figures: dict  # this shape's entry of the results
    timed: list[TokenizedRequest] = field(init=False)
    warm_ids: list[TokenizedRequest] = field(init=False)

    def __post_init__(self):
        self.timed, self.warm_ids = tokenize(self.requests), tokenize(self.warm, tag="w")

    def record(self, part: str, **figures) -> None:
        self.figures.setdefault(part, {}).update(figures)
        self.recorder.save()

    def workload(self, salt: int, **changes) -> list[TokenizedRequest]:
        """Other prompts drawn from the workload's spec (`salt`), with `changes` to it."""
        s = self.settings
        spec = replace(workload_spec(s, self.name), **changes)
        return tokenize(build_requests(spec, {self.name: target_model(self.loaded)}, salt=salt), tag=f"s{salt}-")


def workload_spec(s: GpuBenchSettings, name: str) -> WorkloadSpec:
    return WorkloadSpec(s.num_requests, s.prompt_lens, s.max_tokens, models=[name], seed=s.seed, prompts="ids")


def target_model(loaded: LoadedModel) -> TargetModel:
    # A recurrent or state-space model has no longest sequence: any prompt of the workload fits.
    return TargetModel(loaded.max_seq_len or 1 << 20, vocab_size=loaded.model.config.vocab_size)
