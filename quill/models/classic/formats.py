"""What the classic formats share: what a format is, what it turns a checkpoint into, and the helpers their
converters use. The formats themselves are modules of this package, tried in conversion.py's order.

A format is a `ClassicFormat`: `detect(path)` says whether a file or directory is one of its checkpoints
(by file names and a cheap look inside, never by unpickling anything but through `restricted_pickle`), and
`convert(path, vocab)` reads it into a `Converted`: a Quill model with its weights, its tokenizer and the
metadata worth keeping. `vocab` is a vocabulary file or data directory given apart from the model, for
formats that do not keep theirs beside it; None looks beside the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from quill.models.loading.errors import CheckpointError
from quill.models.loading.generation_config import GENERATION_CONFIG_FILE
from quill.models.loading.saving import save_checkpoint
from quill.models.text.tokenizer import Tokenizer
from quill.models.text.toolkit_tokenizer import write_toolkit_tokenizer


@dataclass
class Converted:
    architecture: str  # a key of models.registry.ARCHITECTURES
    model: nn.Module  # on the CPU, float32, its weights read from the original file
    tokenizer: Tokenizer | None  # None for a translation model: its rules are `seq2seq_tokenizer`
    metadata: dict = field(default_factory=dict)  # "source_format" and whatever the original said of itself
    # A translation model's text rules and vocabularies (quill/models/text/toolkit_tokenizer.py), files by path
    seq2seq_tokenizer: dict | None = None
    # Specials of the target vocabulary (names in its "specials") the toolkit's decoder never emits (fairseq's pad):
    # written as generation_config.json's bad words, which every request then bans
    never_generated: tuple[str, ...] = ()

    def save(self, directory: Path, dtype: torch.dtype = torch.float32, metadata: dict | None = None) -> Path:
        """Write it as a Quill checkpoint directory (`metadata`: instead of its own)."""
        spec = self.seq2seq_tokenizer
        eos = None if spec is None else spec["target_vocab"].index(spec["specials"]["eos"])
        out = save_checkpoint(directory, self.architecture, self.model, self.tokenizer, dtype=dtype,
                              metadata=self.metadata if metadata is None else metadata, eos_token_id=eos)
        if spec is not None:
            write_toolkit_tokenizer(out, spec)
            banned = [[spec["target_vocab"].index(spec["specials"][name])] for name in self.never_generated]
            if banned:
                (out / GENERATION_CONFIG_FILE).write_text(json.dumps({"bad_words_ids": banned}) + "\n")
        return out


@dataclass(frozen=True)
class ClassicFormat:
    name: str  # as the user names it: "word_language_model", "awd_lstm", "fconv_lm"
    detect: Callable[[Path], bool]
    convert: Callable[[Path, Path | None], Converted]
    # The files a conversion reads (model, vocabulary): what a cached conversion is keyed by. None: the path
    # given (a directory: every file under it) and the vocabulary given, if any.
    inputs: Callable[[Path, Path | None], list[Path]] | None = None


def find_model_file(path: Path, names: tuple[str, ...], suffixes: tuple[str, ...]) -> Path | None:
    """The model file `path` is, or holds: the first of `names` there, else its only file ending in `suffixes`."""
    if path.is_file():
        return path
    if not path.is_dir():
        return None
    for name in names:
        if (path / name).is_file():
            return path / name
    candidates = sorted(p for p in path.iterdir() if p.suffix in suffixes and p.is_file())
    return candidates[0] if len(candidates) == 1 else None


def require_tensors(tensors: dict[str, torch.Tensor], keys: tuple[str, ...], file: Path, what: str) -> None:
    """Refuse a file that lacks any of `keys`: without them it is not `what` ("a fastai AWD-LSTM ...")."""
    for key in keys:
        if key not in tensors:
            raise CheckpointError(file, f"no tensor {key}: not {what}")


def is_tied(embedding: torch.Tensor, output: torch.Tensor) -> bool:
    """Whether the output layer's weight is the embedding's: tied weights are saved twice, and Quill ties them."""
    return embedding.shape == output.shape and torch.equal(embedding, output)


def output_layer(config, weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The output layer's tensors by Quill's names, as `config` (tie_embeddings, output_bias) needs them."""
    layer = {} if config.tie_embeddings else {"lm_head.weight": weight}
    if config.output_bias:
        layer["lm_bias"] = bias
    return layer


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], file: Path, what: str,
                 assign: bool = False) -> None:
    """Load `state` into `model` as float32, every tensor there and of its shape and none more; else a
    CheckpointError saying how the file's tensors do not fit `what`. `assign` for a model built on meta."""
    try:
        model.load_state_dict({k: t.float() for k, t in state.items()}, strict=True, assign=assign)
    except RuntimeError as e:
        # torch lists the missing, unexpected and misshapen tensors a line each, under a header
        problems = [line.strip().rstrip(".") for line in str(e).splitlines()[1:]] or [str(e)]
        raise CheckpointError(file, f"the state dict does not fit {what}: {'; '.join(problems)}") from None
