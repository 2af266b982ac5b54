"""The kinds of state a model keeps per sequence, and what the engine does with each.

A model names what it keeps (`state_kind`, quill/models/state.py); the engine reads that name here, once, and works
with these objects from then on. Each kind says how its state is sized and allocated, which cache manager hands
it out, where a sequence's share sits in the runner's table (its columns), how a manager's copies and resets are
carried out on the tensors, and how many bytes it holds:
- `KVBlocks`: K,V in fixed-size blocks, as many per sequence as its tokens need; sized from memory; forked by
  sharing blocks (copy-on-write) and prefix-cached per full block (kv_blocks.py).
- `Slots`: a fixed-size state per sequence (LSTM (h, c), convolution windows, SSM states, xLSTM's C, n, m), one
  slot each, plus spare slots that hold prefix snapshots; forked and snapshotted by copying a slot (state_slots.py).
A model may hold both (LFM2: convolution windows in its conv layers, K,V in its attention layers): `StateLayout`
gives each kind its own columns of the table (the slot first, then the blocks) and joins their managers
(hybrid_cache.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from quill.models.batch import StepBatch
from quill.models.state import EncoderDecoderState, new_model_state, state_parts

from .manager import CacheOp
from .encoder_cache import EncoderCacheManager
from .encoder_decoder_cache import EncoderDecoderCacheManager
from .hybrid_cache import HybridCacheManager
from .kv_blocks import KVBlockManager
from .memory import DEFAULT_CACHE_BYTES, choose_cache_bytes
from .state_slots import StateSlotManager


class StateKind(ABC):
    part: str  # which tensors of the model's state it is ("kv", "slots"), and the tag of its managers' ops

    @abstractmethod
    def width(self, max_model_len: int | None) -> int:
        """Columns of the runner's table one sequence needs."""

    @abstractmethod
    def locate(self, step: StepBatch, ids: torch.Tensor) -> None:
        """Give a step its sequences' share of this state from their columns `ids` (B, width) of the table."""

    @staticmethod
    @abstractmethod
    def apply(tensors, op: CacheOp) -> None:
        """Carry out one of its manager's copies or resets on its tensors."""

    @abstractmethod
    def num_bytes(self, tensors) -> int: ...

    @abstractmethod
    def describe(self, tensors) -> str: ...


class KVBlocks(StateKind):
    part = "kv"

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.manager = KVBlockManager(num_blocks, block_size, enable_prefix_caching)
        self.scratch = num_blocks  # one block past those handed out: CUDA graphs' padding rows write there

    def width(self, max_model_len: int | None) -> int:
        return -(-(max_model_len or 4096) // self.block_size)

    def locate(self, step: StepBatch, ids: torch.Tensor) -> None:
        step.block_tables = ids

    @staticmethod
    def apply(tensors, op: CacheOp) -> None:
        if op.kind == "copy":
            tensors.copy_blocks(list(op.src), list(op.dst))
        else:
            raise ValueError(f"K,V blocks are never {op.kind}")

    def num_bytes(self, tensors) -> int:
        return tensors.bytes_per_block * tensors.num_blocks

    def describe(self, tensors) -> str:
        """What sequences can use: not the scratch block that graphs' padding rows write to."""
        return (f"{self.num_blocks * self.block_size} tokens of K,V in blocks of {self.block_size}, "
                f"attention {tensors.attention.name}")


class Slots(StateKind):
    part = "slots"

    def __init__(self, num_seqs: int, num_snapshots: int, interval: int, enable_prefix_caching: bool,
                 aligned: bool = False):
        self.num_seqs, self.num_snapshots = num_seqs, num_snapshots
        self.num_slots = num_seqs + num_snapshots
        self.manager = StateSlotManager(self.num_slots, num_seqs, interval, enable_prefix_caching, aligned)
        self.scratch = self.num_slots

    def width(self, max_model_len: int | None) -> int:
        return 1

    def locate(self, step: StepBatch, ids: torch.Tensor) -> None:
        step.slots = ids[:, 0]

    @staticmethod
    def apply(tensors, op: CacheOp) -> None:
        if op.kind == "reset":
            tensors.reset(list(op.dst))
        else:
            tensors.copy(list(op.src), list(op.dst))

    def num_bytes(self, tensors) -> int:
        return tensors.bytes_per_slot * tensors.num_slots

    def describe(self, tensors) -> str:
        mib = tensors.bytes_per_slot / 2**20
        return f"state slots of {mib:.2f} MiB for {self.num_seqs} sequences and {self.num_snapshots} prefix snapshots"


class EncoderBlocks(StateKind):
    """An encoder-decoder model's encoder outputs: a request's in as many blocks as its source needs (and the rows
    past it the model asks for: `extra_rows`), read by all its sequences (encoder_cache.py). Its columns: the
    source's length, then its blocks."""

    part = "encoder"

    def __init__(self, num_blocks: int, block_size: int, max_source_len: int, extra_rows: int = 0):
        self.num_blocks, self.block_size = num_blocks, block_size
        width = -(-(max_source_len + extra_rows) // block_size)
        self.manager = EncoderCacheManager(num_blocks, block_size, width, extra_rows)
        self.scratch = num_blocks

    def width(self, max_model_len: int | None) -> int:
        return 1 + self.manager.width

    def locate(self, step: StepBatch, ids: torch.Tensor) -> None:
        step.cross_lens, step.cross_tables = ids[:, 0], ids[:, 1:]

    @staticmethod
    def apply(tensors, op: CacheOp) -> None:
        raise ValueError(f"encoder blocks are never {op.kind}: the encoder writes them (ModelRunner.encode)")

    def num_bytes(self, tensors) -> int:
        return tensors.bytes_per_block * tensors.num_blocks

    def describe(self, tensors) -> str:
        return f"{self.num_blocks * self.block_size} rows of encoder output in blocks of {self.block_size}"


def _encoder_decoder_budget(model, cache) -> int:
    """The bytes an encoder-decoder model's state may take: --cache-bytes, else 256 MiB off CUDA, on CUDA half of
    the memory free after loading, times --gpu-memory-utilization."""
    if cache.cache_bytes is not None:
        return cache.cache_bytes
    device = next(model.parameters()).device
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0] * cache.gpu_memory_utilization / 2)
    return DEFAULT_CACHE_BYTES


def plan_encoder_decoder(model, cache, scheduler, max_model_len: int | None, spare: int) -> "StateLayout":
    """An encoder-decoder model's state. A Transformer decoder's K,V blocks and the encoder's output take half of
    the budget each (their bytes per token are the same: a layer's K and V each). A recurrent or convolutional
    decoder takes a slot per sequence the scheduler may run (no prefix snapshots: its state follows a source), and
    the encoder's output the rest."""
    budget = _encoder_decoder_budget(model, cache)
    probe = model.new_state(1, block_size=cache.block_size, num_encoder_blocks=1)
    encoder_block = probe.encoder.bytes_per_block
    extra_rows = getattr(model, "encoder_state_rows", 0)
    if probe.slots is not None:
        seqs = scheduler.max_num_seqs
        decoder = Slots(seqs, 0, cache.block_size, enable_prefix_caching=False)
        encoder_bytes = budget - probe.slots.bytes_per_slot * (seqs + spare)
    else:
        decoder = KVBlocks(cache.num_blocks or max(1, budget // 2 // probe.kv.bytes_per_block), cache.block_size,
                           enable_prefix_caching=False)
        encoder_bytes = budget // 2
    num_encoder_blocks = cache.num_blocks or max(1, encoder_bytes // encoder_block)
    encoder = EncoderBlocks(num_encoder_blocks, cache.block_size, model.config.max_source_len, extra_rows)
    return StateLayout(model, [encoder, decoder], spare, max_model_len)


def plan_state(model, cache, scheduler, max_model_len: int | None, spare: int, graph_batch_size: int = 0,
               ) -> "StateLayout":
    """Size and allocate a model's state for an engine (`cache`: its CacheConfig, `scheduler`: its SchedulerConfig).
    Every sequence the scheduler may run gets a slot; prefix snapshots get up to `snapshots_per_seq` slots per
    sequence within `cache.cache_bytes` (256 MiB when not given). K,V blocks take `cache.cache_bytes` (or what
    memory.py measures is left on a GPU) less a hybrid's slots."""
    if model.state_kind == EncoderDecoderState.kind:
        return plan_encoder_decoder(model, cache, scheduler, max_model_len, spare)
    kinds: list[StateKind] = []
    kv_probe, slots_probe = state_parts(new_model_state(model, 1, 1, cache.block_size))
    hybrid = kv_probe is not None and slots_probe is not None
    slot_bytes = 0
    if slots_probe is not None:
        per_slot = slots_probe.bytes_per_slot
        num_seqs = scheduler.max_num_seqs
        num_snapshots = num_seqs * cache.snapshots_per_seq
        if not hybrid:  # snapshots take what the cache budget leaves beside the sequences' own slots
            budget = DEFAULT_CACHE_BYTES if cache.cache_bytes is None else cache.cache_bytes
            num_snapshots = min(num_snapshots, max(0, budget // per_slot - num_seqs))
        kinds.append(Slots(num_seqs, num_snapshots, cache.block_size, cache.enable_prefix_caching,
                           aligned=hybrid))  # a hybrid's snapshots must meet whole K,V blocks
        slot_bytes = per_slot * (num_seqs + num_snapshots + spare)
    if kv_probe is not None:
        num_blocks = cache.num_blocks or max(1, (choose_cache_bytes(
            model, cache.cache_bytes, cache.gpu_memory_utilization, cache.block_size,
            scheduler.max_num_batched_tokens, max_model_len, graph_batch_size, scheduler.max_num_seqs,
        ) - slot_bytes) // kv_probe.bytes_per_block)
        kinds.append(KVBlocks(num_blocks, cache.block_size, cache.enable_prefix_caching))
    return StateLayout(model, kinds, spare, max_model_len)


def _merge_copies(ops: list[CacheOp]) -> list[CacheOp]:
    """Consecutive K,V block copies joined where doing them at once reads what doing them in order reads: no copy
    reads or rewrites a block an earlier one of the run wrote."""
    merged: list[CacheOp] = []
    written: set[int] = set()
    for op in ops:
        last = merged[-1] if merged else None
        joins = (last is not None and op.part == last.part == "kv" and op.kind == last.kind == "copy"
                 and written.isdisjoint(op.src) and written.isdisjoint(op.dst) and len(set(op.dst)) == len(op.dst))
        if joins:
            merged[-1] = CacheOp("copy", last.src + op.src, last.dst + op.dst, "kv")
            written.update(op.dst)
        else:
            merged.append(op)
            written = set(op.dst) if op.kind == "copy" and op.part == "kv" else set()
    return merged


class StateLayout:
    """The kinds of state one model holds, each in its columns of the runner's table (a slot first, then blocks),
    and one cache manager over them all. `spare` (0 or 1): a scratch block and slot past those the managers hand
    out, where CUDA graphs' padding rows write."""

    def __init__(self, model, kinds: list[StateKind], spare: int, max_model_len: int | None):
        self.kinds = sorted(kinds, key=lambda kind: isinstance(kind, KVBlocks))  # blocks last: their width varies
        self.widths = [kind.width(max_model_len) for kind in self.kinds]
        self.width = sum(self.widths)
        self._by_part = {kind.part: kind for kind in self.kinds}
        kv, slots, encoder = (self._by_part.get(part) for part in ("kv", "slots", "encoder"))
        self.block_size = None if kv is None else kv.block_size  # None: a step's width is fixed
        if encoder is not None:  # a decoder's blocks, or its slots
            decoder_size = kv.num_blocks if kv is not None else slots.num_slots
            self.state = model.new_state(decoder_size + spare, block_size=encoder.block_size,
                                         num_encoder_blocks=encoder.num_blocks + spare)
        else:
            self.state = new_model_state(model, 0 if kv is None else kv.num_blocks + spare,
                                         0 if slots is None else slots.num_slots + spare, self.block_size)
        self._tensors = dict(zip(("kv", "slots"), state_parts(self.state)))
        if encoder is not None:
            self._tensors["encoder"] = self.state.encoder
            self.cache = EncoderDecoderCacheManager(encoder.manager, (kv or slots).manager)
        elif len(self.kinds) == 1:
            self.cache = self.kinds[0].manager
        else:
            self.cache = HybridCacheManager(slots.manager, kv.manager)

    def tensors(self, kind: StateKind):
        return self._tensors[kind.part]

    def apply(self, ops: list[CacheOp]) -> None:
        """Carry out the managers' device work, in order; a run of block copies as one gather and scatter (a beam
        search's step copies on write a block for each of its forks: one indexed copy each cost more than all)."""
        for op in _merge_copies(ops):
            kind = self._by_part[op.part]
            kind.apply(self.tensors(kind), op)

    def columns(self, longest: int | None) -> int:
        """Table columns a step gathers when its longest sequence holds `longest` tokens (None: every column)."""
        if longest is None or self.block_size is None:
            return self.width
        return self.width - self.widths[-1] + -(-longest // self.block_size)

    def locate(self, step: StepBatch, ids: torch.Tensor) -> None:
        """Give `step` its sequences' slots and block tables from their gathered table rows `ids` (B, columns)."""
        start = 0
        for kind, width in zip(self.kinds, self.widths):
            kind.locate(step, ids[:, start : start + width])  # the last kind's slice ends where `ids` does
            start += width

    def padding(self) -> list[int]:
        """The scratch slot or block of each column, for the table's padding row."""
        return [kind.scratch for kind, width in zip(self.kinds, self.widths) for _ in range(width)]

    @property
    def num_bytes(self) -> int:
        return sum(kind.num_bytes(self.tensors(kind)) for kind in self.kinds)

    def describe(self) -> str:
        return "; ".join(kind.describe(self.tensors(kind)) for kind in self.kinds)

    @property
    def num_kv_blocks(self) -> int | None:
        """The K,V blocks sequences can use (not the scratch block); None for a model that keeps none."""
        kv = self._by_part.get("kv")
        return None if kv is None else kv.num_blocks
