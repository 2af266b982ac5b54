"""One rank's shard of a Transformer checkpoint, read slice by slice: no rank reads a whole split tensor.

The checkpoint's tensors are memory-mapped, and safetensors' `get_slice` reads the rows or columns asked for. A
parameter built from several tensors (Llama's q, k, v fused; gate and up) takes its rows from each; one stored
transposed (GPT-2's Conv1D) takes its rows as the stored tensor's columns. The shard's model is the whole model's
config with this rank's sizes (plan.py); it gets its collectives once the group has met (`attach_group`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..attention import select_attention_backend
from ..families.transformer import TransformerConfig, TransformerLanguageModel
from ..kernels import select_layer_ops
from ..loading.checkpoint import expected_sources, read_config
from ..loading.errors import CheckpointError
from ..loading.hf import TensorSource
from ..loading.saving import CONFIG_FILE
from ..loading.weights import CheckpointTensors, check_tensors, open_weights
from .collectives import Collectives
from .hooks import TensorParallel
from .plan import ShardPlan, check_shardable

PARALLEL_ARCHITECTURES = ("transformer",)  # the decoder-only Transformer family: Llama and its relatives, GPT-2


def check_parallel(architecture: str, config, size: int) -> None:
    """ValueError unless a model of `architecture` with `config` can be split over `size` ranks."""
    if architecture not in PARALLEL_ARCHITECTURES or not isinstance(config, TransformerConfig):
        raise ValueError(f"tensor parallelism serves the decoder-only Transformer family (Llama and its relatives, "
                         f"GPT-2), not a {architecture!r} model")
    check_shardable(config, size)


def _slice(source: TensorSource, handles: list, dim: int, ranges: list[range]) -> torch.Tensor:
    """The rows (`dim` 0) or columns (1) `ranges` of the parameter `source` makes, read from the files."""
    slices = [handle.get_slice(name) for handle, name in zip(handles, source.sources)]
    stored_dim = 1 - dim if source.transpose and len(slices[0].get_shape()) == 2 else dim
    if stored_dim == 1:  # each source's columns, the sources joined as `combine` joins them
        part = torch.cat([torch.cat([s[:, r.start : r.stop] for r in ranges], 1) for s in slices], 0)
    else:  # along the dimension the sources are joined on: each range from the sources it covers
        pieces, offset = [], 0
        for s in slices:
            length = s.get_shape()[0]
            pieces += [s[max(r.start, offset) - offset : min(r.stop, offset + length) - offset]
                       for r in ranges if max(r.start, offset) < min(r.stop, offset + length)]
            offset += length
        part = torch.cat(pieces, 0) if pieces else slices[0][0:0]
    return part.t() if source.transpose else part


def read_shard(tensors: CheckpointTensors, sources: list[TensorSource], plan: ShardPlan,
               shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Our parameter name -> this rank's part of it, of the shard model's shape, in `dtype` on `device`."""
    check_tensors(tensors, sources)
    weights = {}
    for source in sources:
        handles = [tensors.where[name][1] for name in source.sources]
        split = plan.shard_of(source.name)
        if split is None:
            tensor = source.combine([handle.get_tensor(name) for handle, name in zip(handles, source.sources)])
        else:
            dim, ranges = split
            tensor = _slice(source, handles, dim, ranges)
            short = shapes[source.name][dim] - tensor.shape[dim]
            if short > 0 and source.name in ("embed.weight", "lm_head.weight", "lm_bias"):  # the vocabulary's tail
                padding = list(tensor.shape)
                padding[dim] = short
                tensor = torch.cat([tensor, tensor.new_zeros(padding)], dim)
        expected = tuple(shapes[source.name])
        if tuple(tensor.shape) != expected:
            raise CheckpointError(tensors.where[source.sources[0]][0],
                                  f"tensor {', '.join(source.sources)} gives rank {plan.rank} a part of shape "
                                  f"{tuple(tensor.shape)}, expected {expected}")
        weights[source.name] = tensor.to(device=device, dtype=dtype)
    return weights


def load_shard(path: Path, rank: int, size: int, device: torch.device, dtype: torch.dtype,
               attention_backend: str = "auto", layer_ops: str = "auto") -> tuple[TransformerLanguageModel, ShardPlan]:
    """Rank `rank`'s model of the checkpoint directory `path` split `size` ways, for inference, and its plan."""
    architecture, config, _, _ = read_config(path / CONFIG_FILE)
    check_parallel(architecture, config, size)
    plan = ShardPlan(config, rank, size)
    with torch.device("meta"):
        model = TransformerLanguageModel(plan.local_config())
    for name, module in model.named_modules():
        if getattr(module, "bias", None) is not None and plan.drops_bias(f"{name}.bias"):
            module.bias = None  # rank 0 adds it: the all-reduce then counts it once
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    with open_weights(path) as tensors:
        try:
            sources = expected_sources(model.config, model, tensors.names)
        except ValueError as e:
            raise CheckpointError(path / CONFIG_FILE, str(e)) from None
        model.load_state_dict(read_shard(tensors, sources, plan, shapes, dtype, device), strict=True, assign=True)
    model.eval().requires_grad_(False)
    model.attention_backend = select_attention_backend(attention_backend, device).name
    model.layer_ops = select_layer_ops(layer_ops, device)
    return model, plan


def attach_group(model: TransformerLanguageModel, plan: ShardPlan, group: Collectives) -> None:
    """From now on the shard's steps join the group's collectives."""
    model.parallel = TensorParallel(group, plan.rank * plan.vocab_shard, plan.vocab_shard, plan.config.vocab_size)
