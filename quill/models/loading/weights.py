"""A checkpoint's weights: one model.safetensors, or the shards that
model.safetensors.index.json lists, read into our parameters.

Every tensor a model needs is checked from the file headers (present, in a dtype
Quill can serve) before any is read, so a checkpoint is refused whole or loaded
whole, never into wrong weights. Files are memory-mapped, and parameters are read
shard after shard, each converted to the serving dtype and device as it is read:
memory holds the model being built plus the tensor in flight, never a second copy
of the checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from .errors import CheckpointError
from .hf import TensorSource

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
# The safetensors dtypes Quill converts from, with their sizes in bytes.
SERVABLE_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
PROGRESS_MIN_BYTES = 256 * 2**20  # smaller checkpoints load in a blink: no bar


def show_progress(total_bytes: int, stream=None) -> bool:
    """A progress bar only on a terminal, and only for a checkpoint that takes a while to read."""
    stream = stream if stream is not None else sys.stderr
    return total_bytes >= PROGRESS_MIN_BYTES and hasattr(stream, "isatty") and stream.isatty()


def _shard_map(directory: Path) -> dict[str, Path]:
    """tensor name -> shard file, from model.safetensors.index.json."""
    index = directory / WEIGHTS_INDEX_FILE
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, AttributeError) as e:
        raise CheckpointError(index, f"not a valid shard index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(index, "must hold a \"weight_map\" object of tensor name -> shard file")
    files = {}
    for file in sorted(set(weight_map.values())):
        shard = directory / file
        # The index names files, not paths. Lexically: in the hub cache a snapshot's files are links into blobs/.
        if os.path.dirname(os.path.normpath(shard)) != os.path.normpath(directory):
            raise CheckpointError(index, f"shard {file!r} is not a file of the checkpoint directory")
        if not shard.is_file():
            raise CheckpointError(shard, f"missing file (a shard listed in {WEIGHTS_INDEX_FILE})")
        files[file] = shard
    return {name: files[file] for name, file in weight_map.items()}


def has_weights(directory: Path) -> bool:
    return (directory / WEIGHTS_FILE).is_file() or (directory / WEIGHTS_INDEX_FILE).is_file()


@dataclass
class CheckpointTensors:
    """The tensors of one checkpoint: where each is, and the file that lists them all."""

    listing: Path  # model.safetensors, or the shard index
    where: dict[str, tuple[Path, object]]  # tensor name -> (its file, that file's open safetensors handle)
    contents: dict[Path, set[str]]  # file -> the tensors its header really holds

    @property
    def names(self) -> set[str]:
        return set(self.where)


@contextmanager
def open_weights(directory: Path) -> Iterator[CheckpointTensors]:
    """The checkpoint's tensors, with their files open (memory-mapped) until the block ends."""
    single = directory / WEIGHTS_FILE
    if not has_weights(directory):
        raise CheckpointError(single, f"missing file (and no {WEIGHTS_INDEX_FILE} of shards)")
    with ExitStack() as stack:
        handles, contents = {}, {}

        def handle(file: Path):
            if file not in handles:
                try:
                    handles[file] = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                except Exception as e:  # safetensors raises its own error types for a corrupt header
                    raise CheckpointError(file, f"not a readable safetensors file ({e})") from None
                contents[file] = set(handles[file].keys())
            return handles[file]

        if single.is_file():  # as transformers does, a single file wins over an index
            handle(single)
            yield CheckpointTensors(single, {name: (single, handles[single]) for name in contents[single]}, contents)
        else:
            shards = _shard_map(directory)
            where = {name: (file, handle(file)) for name, file in shards.items()}
            yield CheckpointTensors(directory / WEIGHTS_INDEX_FILE, where, contents)


def _describe(dtype: str) -> str:
    if dtype.startswith("F8"):
        return f"float8 ({dtype})"
    if dtype[0] in "IU":
        return f"integer ({dtype}, as quantized checkpoints pack weights)"
    return dtype


def check_tensors(tensors: CheckpointTensors, sources: list[TensorSource]) -> int:
    """Refuse a missing tensor or an unservable dtype before reading anything; the bytes to read."""
    total = 0
    for source in sources:
        for name in source.sources:
            if name not in tensors.where:
                raise CheckpointError(tensors.listing, f"missing tensor {name!r}")
            file, handle = tensors.where[name]
            if name not in tensors.contents[file]:
                raise CheckpointError(file, f"missing tensor {name!r} (the shard index lists it here)")
            header = handle.get_slice(name)
            dtype = header.get_dtype()
            if dtype not in SERVABLE_DTYPES:
                served = "Quill serves float32, float16 and bfloat16 weights only"
                raise CheckpointError(file, f"tensor {name!r} is {_describe(dtype)}: {served}")
            total += SERVABLE_DTYPES[dtype] * torch.Size(header.get_shape()).numel()
    return total


def read_weights(
    tensors: CheckpointTensors,
    sources: list[TensorSource],
    shapes: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device,
    label: str = "weights",
) -> dict[str, torch.Tensor]:
    """Our parameter name -> tensor of its expected shape, in `dtype` on `device`."""
    total = check_tensors(tensors, sources)
    # Shard after shard, so each file is read through once.
    where = tensors.where
    ordered = sorted(sources, key=lambda s: str(where[s.sources[0]][0]))
    weights = {}
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"loading {label}",
              disable=not show_progress(total)) as progress:
        for source in ordered:
            parts = [where[name][1].get_tensor(name) for name in source.sources]
            tensor = source.combine(parts)
            file = where[source.sources[0]][0]
            expected = tuple(shapes[source.name])
            if tuple(tensor.shape) != expected:
                raise CheckpointError(
                    file, f"tensor {', '.join(source.sources)} has shape {tuple(tensor.shape)}, expected {expected}"
                )
            weights[source.name] = tensor.to(device=device, dtype=dtype)
            progress.update(sum(p.nbytes for p in parts))
            del parts, tensor
    return weights
