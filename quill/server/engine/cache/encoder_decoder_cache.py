"""One cache manager over an encoder-decoder model's state: its requests' encoder outputs (encoder_cache.py) and
its sequences' decoder state: a Transformer decoder's self-attention K,V blocks (kv_blocks.py), or a recurrent or
convolutional decoder's slot (state_slots.py).

A sequence's row of the runner's table holds its source's length and encoder blocks first, then its own blocks or
slot (the decoder's manager writes its edits shifted past the encoder's columns). The scheduler acquires a
request's encoder entry at admission and binds its sequences to it (`encoder`); everything per sequence goes to the
decoder's manager, a fork also to the encoder manager (the child reads the same entry). The decoder's state is never
prefix-cached: two requests with the same decoder prompt but different sources share nothing.
"""

from __future__ import annotations

from .encoder_cache import EncoderCacheManager
from .kv_blocks import KVBlockManager
from .manager import CacheOp
from .state_slots import StateSlotManager


class EncoderDecoderCacheManager:
    def __init__(self, encoder: EncoderCacheManager, decoder: KVBlockManager | StateSlotManager):
        self.encoder, self.decoder = encoder, decoder
        self.table_edits = encoder.table_edits
        decoder.table_edits = self.table_edits.shifted(1 + encoder.width)

    @property
    def prefix_queries(self) -> int:
        return self.encoder.queries  # sources looked up

    @property
    def prefix_hits(self) -> int:
        return self.encoder.hits  # sources found encoded

    @property
    def usage(self) -> float:
        return max(self.encoder.usage, self.decoder.usage)

    def can_admit(self, num_seqs: int = 1) -> bool:
        return self.decoder.can_admit(num_seqs)

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int) -> int:
        return self.decoder.admit(seq_id, token_ids, 0)

    def chunk_limit(self, seq_id: int, num_computed: int, num_prompt_tokens: int) -> int | None:
        return None

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        return self.decoder.allocate(seq_id, num_computed, num_new_tokens)

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        self.decoder.commit(seq_id, token_ids, num_computed, num_prompt_tokens)

    def fork(self, parent_id: int, child_id: int) -> None:
        self.decoder.fork(parent_id, child_id)
        self.encoder.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        self.decoder.free(seq_id)
        self.encoder.unbind(seq_id)

    def retire(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        self.free(seq_id)

    def reset(self) -> None:
        self.decoder.reset()
        self.encoder.reset()

    def take_ops(self) -> list[CacheOp]:
        return self.decoder.take_ops()

    def step_finished(self) -> None:
        self.decoder.step_finished()
