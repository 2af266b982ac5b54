"""generation_config.json: the end-of-sequence ids a checkpoint stops on, and the sampling
settings its makers recommend.

The recommendations are what vLLM's `--generation-config auto` applies to a request that
leaves a setting out: the same six settings, under `SamplingParams` names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckpointError, read_json_object

GENERATION_CONFIG_FILE = "generation_config.json"

# generation_config.json key -> SamplingParams field, with the type it must have.
SAMPLING_DEFAULTS = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "repetition_penalty": ("repetition_penalty", float),
    "max_new_tokens": ("max_tokens", int),
}


@dataclass
class GenerationConfig:
    eos_token_ids: list[int] = field(default_factory=list)
    defaults: dict = field(default_factory=dict)  # SamplingParams field -> value


def _number(path: Path, key: str, value, kind: type):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (kind is int and value != int(value)):
        raise CheckpointError(path, f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def read_generation_config(directory: Path) -> GenerationConfig:
    """The checkpoint's generation config; empty when it ships none."""
    path = directory / GENERATION_CONFIG_FILE
    if not path.is_file():
        return GenerationConfig()
    raw = read_json_object(path)
    eos = raw.get("eos_token_id")
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    eos = [_number(path, "eos_token_id", i, int) for i in eos]
    defaults = {
        name: _number(path, key, raw[key], kind)
        for key, (name, kind) in SAMPLING_DEFAULTS.items()
        if raw.get(key) is not None
    }
    return GenerationConfig(eos, defaults)
