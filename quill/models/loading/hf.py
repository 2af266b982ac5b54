"""Hugging Face checkpoints, read as they are on disk.

Maps a `config.json` to a `TransformerConfig`, and our parameter names to the
checkpoint's tensors (fusing q/k/v and gate/up into single matmuls, transposing
GPT-2's Conv1D), through the family tables of `hf_families`. No conversion step:
this runs at load time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable

import torch

from ..families.transformer import TransformerConfig
from .hf_families import FAMILIES as DECODER_FAMILIES
from .hf_families import Family
from .hf_seq2seq import SEQ2SEQ_FAMILIES

FAMILIES: dict[str, Family] = {**DECODER_FAMILIES, **SEQ2SEQ_FAMILIES}
HF_MODEL_TYPES = tuple(FAMILIES)
_LAYER = re.compile(r"\blayers\.(\d+)\.")  # a layer's index, in a stack's name ("encoder.layers.3.") or alone


@dataclass
class TensorSource:
    """Our parameter `name` is built from the checkpoint tensors `sources` by `combine`."""

    name: str
    sources: list[str]
    combine: Callable[[list[torch.Tensor]], torch.Tensor]
    # `combine` joins the sources along their first dimension, then transposes (GPT-2's Conv1D) where this is set:
    # what a tensor-parallel rank needs to read only its slice (models.parallel.shard_loading)
    transpose: bool = False


def same_name(name: str) -> TensorSource:
    """A parameter stored under its own name (Quill's own checkpoints)."""
    return TensorSource(name, [name], lambda ts: ts[0])


def is_hf_config(raw: dict) -> bool:
    return "architecture" not in raw and ("model_type" in raw or "architectures" in raw)


def eos_ids(raw: dict) -> list[int]:
    """config.json's eos_token_id, which may be one id or a list."""
    eos = raw.get("eos_token_id")
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list) else [eos]


def family_of(raw: dict) -> Family:
    """The family of a config.json; ValueError naming the supported ones if Quill has none for it."""
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported Hugging Face model_type {model_type!r} (supported: {', '.join(HF_MODEL_TYPES)})")
    return FAMILIES[model_type]


def config_from_hf(raw: dict) -> tuple[TransformerConfig, list[int]]:
    """config.json of a supported family -> our config (of the family's architecture) and its end-of-sequence ids."""
    family = family_of(raw)
    model_type = raw["model_type"]
    try:
        config = family.read_config({**family.defaults, **raw})
    except KeyError as e:
        raise ValueError(f"{model_type} config has no {e.args[0]!r}") from None
    return config, eos_ids(raw)


def _present(name: str, names: set[str]) -> str:
    """"a|b": the first of a and b the checkpoint holds (a tied tensor saved under either name); else `name`."""
    choices = name.split("|")
    return next((n for n in choices if n in names), choices[0])


def tensor_sources(config: TransformerConfig, params: Iterable[str], names: set[str]) -> list[TensorSource]:
    """Where each of our parameters `params` comes from, given the tensor names the checkpoint holds."""
    family = FAMILIES[config.extra["hf_model_type"]]
    if family.tensors is None:
        return [same_name(param) for param in params]
    table = family.tensors(config) if callable(family.tensors) else family.tensors  # a table per configuration
    # A ...ForCausalLM checkpoint nests the base model under a prefix; a bare base model does not.
    prefix = family.prefix if any(n.startswith(family.prefix) for n in names) else ""
    out = []
    for param in params:
        layer = _LAYER.search(param)
        key = _LAYER.sub("layers.{i}.", param)
        stem, _, kind = key.rpartition(".")
        source = table.get(key) or table.get(stem + ".{w}")
        if source is None:  # our model grew a parameter the family's table does not know
            raise ValueError(f"no {config.extra['hf_model_type']} checkpoint tensor is known for parameter {param!r}")
        fill = dict(p=prefix, i=layer.group(1) if layer else "", w=kind)
        out.append(TensorSource(param, [_present(n.format(**fill), names) for n in source.names], source.combine,
                               source.transpose))
    return out
