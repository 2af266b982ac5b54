"""generation_config.json: the end-of-sequence ids a checkpoint stops on, the sampling settings its makers
recommend, and the words it must never say.

The recommendations are what vLLM's `--generation-config auto` applies to a request that leaves a setting out:
the same six settings, under `SamplingParams` names. `bad_words_ids` is transformers' (Marian's checkpoints ban
their pad token with it): banned at every step of every request, as `generate()` bans them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckpointError, read_json_object

log = logging.getLogger(__name__)

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
    bad_words_ids: list[list[int]] = field(default_factory=list)  # token sequences never to generate


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
    bad = raw.get("bad_words_ids") or []
    if not isinstance(bad, list) or not all(isinstance(word, list) and word for word in bad):
        raise CheckpointError(path, f"bad_words_ids must be a list of non-empty lists of token ids, got {bad!r}")
    bad = [[_number(path, "bad_words_ids", i, int) for i in word] for word in bad]
    return GenerationConfig(eos, defaults, bad)


def banned_tokens(config: GenerationConfig, model: str) -> list[int]:
    """The one-token bad words, which the engine bans from every step's logits. Longer ones (banned by
    `generate()` where the tokens before their last were just generated) are not applied: the log says so."""
    longer = [word for word in config.bad_words_ids if len(word) > 1]
    if longer:
        log.warning("%s: generation_config.json's bad_words_ids of more than one token are not applied: %s",
                    model, longer)
    return sorted({word[0] for word in config.bad_words_ids if len(word) == 1})
