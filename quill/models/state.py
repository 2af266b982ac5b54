"""Incremental decoding state, allocated up front with fixed shapes.

Two kinds, matching how the architectures remember the past (`HybridState` holds one of each):
- `SlotState`: a fixed-size state per sequence (LSTM (h, c); gated-CNN convolution
  windows) in a pool of slots. Fork = copy a slot.
- `PagedKVCache`: Transformer keys and values in fixed-size blocks; a sequence owns a
  list of blocks (its block table), so memory grows with the tokens it holds.
The engine owns which slot or block belongs to whom; these classes only hold tensors.
"""

from __future__ import annotations

import torch

from .attention.backend import PagedAttentionBackend
from .attention.sdpa import SdpaPagedAttention
from .host_copy import to_device


def _index(ids, device) -> torch.Tensor:
    return ids.to(device) if isinstance(ids, torch.Tensor) else to_device(ids, device, torch.long)


class SlotState:
    """Named tensors whose first dimension is the slot."""

    kind = "slots"

    def __init__(self, tensors: dict[str, torch.Tensor]):
        sizes = {t.shape[0] for t in tensors.values()}
        if len(sizes) != 1:
            raise ValueError("every state tensor needs the same number of slots")
        self.tensors = tensors
        self.num_slots = sizes.pop()

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values())

    def reset(self, slots) -> None:
        """Give slots the state of an empty sequence (all zeros)."""
        for t in self.tensors.values():
            t[_index(slots, t.device)] = 0

    def copy(self, src, dst) -> None:
        """Fork or snapshot: slots `dst` continue from where slots `src` are."""
        if len(src) <= 4 and not isinstance(src, torch.Tensor):  # the usual one slot: in place, no gathered copy
            for t in self.tensors.values():  # (a large state's temporary would cost page faults on every copy)
                for s, d in zip(src, dst):
                    t[d].copy_(t[s])
            return
        for t in self.tensors.values():
            t[_index(dst, t.device)] = t[_index(src, t.device)]


class BlockTensors:
    """Keys and values of every layer in fixed-size blocks, (n_layers, num_blocks, block_size, heads, head_dim)."""

    def __init__(self, n_layers, num_blocks, block_size, heads, head_dim, dtype, device):
        shape = (n_layers, num_blocks, block_size, heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def bytes_per_block(self) -> int:
        return 2 * self.k[:, 0].numel() * self.k.element_size()


class PagedKVCache(BlockTensors):
    """A Transformer's keys and values, each sequence's in the blocks its table lists."""

    kind = "paged_kv"

    def __init__(self, n_layers, num_blocks, block_size, n_kv_heads, head_dim, dtype, device,
                 attention: type[PagedAttentionBackend] = SdpaPagedAttention):
        super().__init__(n_layers, num_blocks, block_size, n_kv_heads, head_dim, dtype, device)
        self.attention = attention  # how a step writes and reads these blocks (chosen for the device)

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    def copy_blocks(self, src, dst) -> None:
        """Copy-on-write: blocks `dst` get the contents of blocks `src`."""
        src, dst = _index(src, self.k.device), _index(dst, self.k.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


def holds_kv(model) -> bool:
    """Whether the model keeps K,V blocks (it attends over a context, whose length its positions bound)."""
    return model.state_kind in (PagedKVCache.kind, HybridState.kind, EncoderDecoderState.kind)


class HybridState:
    """State of several kinds in one model (LFM2: convolution windows in its conv layers, K,V blocks in its
    attention layers): a sequence owns a slot of `slots` and a block table into `kv`."""

    kind = "hybrid"

    def __init__(self, kv: PagedKVCache, slots: SlotState):
        self.kv = kv
        self.slots = slots


class EncoderCache(BlockTensors):
    """An encoder-decoder model's encoder output: every decoder layer's cross-attention K,V of each request's
    source, in blocks that every sequence of the request reads (beams and samples share them: nothing here is
    copied on a fork)."""

    kind = "encoder"


class EncoderDecoderState:
    """An encoder-decoder model's state: its encoder output (`encoder`, per request) and its decoder's own, of one
    kind: a Transformer decoder's self-attention K,V blocks (`kv`, per sequence, copied on write like a
    decoder-only Transformer's) or a recurrent or convolutional decoder's fixed-size slot per sequence (`slots`:
    an LSTM's (h, c) and input feed, a convolutional decoder's windows)."""

    kind = "encoder_decoder"

    def __init__(self, kv: PagedKVCache | None, encoder: EncoderCache, slots: SlotState | None = None):
        if (kv is None) == (slots is None):
            raise ValueError("an encoder-decoder state holds K,V blocks or slots for its decoder, one of the two")
        self.kv = kv
        self.encoder = encoder
        self.slots = slots


def new_model_state(model, num_blocks: int, num_slots: int, block_size: int | None):
    """A model's state with room for `num_blocks` K,V blocks and `num_slots` slots, of the kinds it holds (each
    model's `new_state` takes only its own): a Transformer's blocks, a recurrent model's slots, a hybrid's both.
    `block_size`: tokens per K,V block (None for a model without K,V)."""
    if model.state_kind == HybridState.kind:
        return model.new_state(num_blocks, num_slots, block_size=block_size)
    if model.state_kind == EncoderDecoderState.kind:  # its encoder blocks are sized apart (new_state's default: 1)
        return model.new_state(num_blocks, block_size=block_size)
    if model.state_kind == PagedKVCache.kind:
        return model.new_state(num_blocks, block_size=block_size)
    if model.state_kind == SlotState.kind:
        return model.new_state(num_slots)
    raise ValueError(f"unknown state kind {model.state_kind!r} (known: paged_kv, slots, hybrid, encoder_decoder)")


def state_parts(state) -> tuple[PagedKVCache | None, SlotState | None]:
    """A model's state as its K,V blocks and its slots, None for a kind it does not hold."""
    if state.kind == HybridState.kind:
        return state.kv, state.slots
    if state.kind == EncoderDecoderState.kind:
        return state.kv, state.slots
    return (state, None) if state.kind == PagedKVCache.kind else (None, state)
