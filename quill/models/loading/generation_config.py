"""generation_config.json: the end-of-sequence ids a checkpoint stops on, the sampling settings its makers
recommend, the words it must never say, and the end it forces at the length limit.

The recommendations are what vLLM's `--generation-config auto` applies to a request that leaves a setting out:
the same six settings, under `SamplingParams` names. `bad_words_ids` is transformers' (Marian's checkpoints ban
their pad token with it): banned in every request, as `generate()` bans them. `forced_eos_token_id` (Marian, BART,
M2M100, FSMT) makes a sequence's last allowed token EOS; a checkpoint without generation_config.json names it in
config.json, where transformers then reads it.
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
    bad_words_ids: list[list[int]] = field(default_factory=list)  # token sequences never to generate
    forced_eos_token_ids: list[int] = field(default_factory=list)  # the last token a length limit allows
    # How generate() decodes it when told nothing (num_beams as beam_width, length_penalty, early_stopping,
    # no_repeat_ngram_size, under SamplingParams names), each only where valid: what an API that names no decoding
    # applies (LibreTranslate's); and max_length, counting the prompt (an encoder-decoder's: its start token)
    beam_defaults: dict = field(default_factory=dict)
    max_length: int | None = None


def _number(path: Path, key: str, value, kind: type):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (kind is int and value != int(value)):
        raise CheckpointError(path, f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _token_ids(path: Path, raw: dict, key: str) -> list[int]:
    """An id or a list of ids (transformers takes either), none when absent."""
    value = raw.get(key)
    value = [] if value is None else value if isinstance(value, list) else [value]
    return [_number(path, key, i, int) for i in value]


def read_generation_config(directory: Path) -> GenerationConfig:
    """The checkpoint's generation config; empty when it ships none but config.json's forced EOS."""
    path = directory / GENERATION_CONFIG_FILE
    if not path.is_file():
        config = directory / "config.json"
        raw = read_json_object(config) if config.is_file() else {}
        return GenerationConfig(forced_eos_token_ids=_token_ids(config, raw, "forced_eos_token_id"))
    raw = read_json_object(path)
    eos = _token_ids(path, raw, "eos_token_id")
    defaults = {
        name: _number(path, key, raw[key], kind)
        for key, (name, kind) in SAMPLING_DEFAULTS.items()
        if raw.get(key) is not None
    }
    bad = raw.get("bad_words_ids") or []
    if not isinstance(bad, list) or not all(isinstance(word, list) and word for word in bad):
        raise CheckpointError(path, f"bad_words_ids must be a list of non-empty lists of token ids, got {bad!r}")
    bad = [[_number(path, "bad_words_ids", i, int) for i in word] for word in bad]
    return GenerationConfig(eos, defaults, bad, _token_ids(path, raw, "forced_eos_token_id"), _beam_defaults(raw),
                            _positive_int(raw.get("max_length")))


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _beam_defaults(raw: dict) -> dict:
    """generate()'s beam settings, leniently: one that is not valid is left out, not a failed load (these are only
    read where a request names no decoding)."""
    out = {}
    if _positive_int(raw.get("num_beams")):
        out["beam_width"] = raw["num_beams"]
    penalty = raw.get("length_penalty")
    if isinstance(penalty, (int, float)) and not isinstance(penalty, bool) and math.isfinite(penalty):
        out["length_penalty"] = float(penalty)
    stop = raw.get("early_stopping")
    if isinstance(stop, bool) or stop == "never":
        out["early_stopping"] = stop
    if _positive_int(raw.get("no_repeat_ngram_size")):
        out["no_repeat_ngram_size"] = raw["no_repeat_ngram_size"]
    return out


def check_token_ids(config: GenerationConfig, vocab_size: int, directory: Path) -> None:
    """The bad words and forced EOS must be tokens of the model: an id past the vocabulary fails the load, not a
    step."""
    ids = [t for word in config.bad_words_ids for t in word] + config.forced_eos_token_ids
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        source = directory / GENERATION_CONFIG_FILE
        source = source if source.is_file() else directory / "config.json"  # where forced EOS came from then
        raise CheckpointError(source, f"token id {bad[0]} is not in the model's vocabulary of {vocab_size}")


def banned_tokens(config: GenerationConfig) -> list[int]:
    """The one-token bad words, which the engine bans from every step's logits."""
    return sorted({word[0] for word in config.bad_words_ids if len(word) == 1})


def bad_word_sequences(config: GenerationConfig) -> list[list[int]]:
    """The longer bad words, banned where the tokens before their last end a sequence: added to every request's
    own (SamplingParams.bad_words_token_ids)."""
    return [word for word in config.bad_words_ids if len(word) > 1]
