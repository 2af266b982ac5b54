"""One cache manager over an encoder-decoder model's state: its requests' encoder outputs (encoder_cache.py) and
its sequences' self-attention K,V blocks (kv_blocks.py).

A sequence's row of the runner's table holds its source's length and encoder blocks first, then its own K,V blocks
(the block manager writes its edits shifted past the encoder's columns). The scheduler acquires a request's encoder
entry at admission and binds its sequences to it (`encoder`); everything per sequence goes to the block manager, a
fork also to the encoder manager (the child reads the same entry). The decoder's blocks are never prefix-cached:
two requests with the same decoder prompt but different sources share nothing.
"""

from __future__ import annotations

from .encoder_cache import EncoderCacheManager
from .kv_blocks import KVBlockManager
from .manager import CacheOp


class EncoderDecoderCacheManager:
    def __init__(self, encoder: EncoderCacheManager, kv: KVBlockManager):
        self.encoder, self.kv = encoder, kv
        self.table_edits = encoder.table_edits
        kv.table_edits = self.table_edits.shifted(1 + encoder.width)

    @property
    def prefix_queries(self) -> int:
        return self.encoder.queries  # sources looked up

    @property
    def prefix_hits(self) -> int:
        return self.encoder.hits  # sources found encoded

    @property
    def usage(self) -> float:
        return max(self.encoder.usage, self.kv.usage)

    def can_admit(self, num_seqs: int = 1) -> bool:
        return self.kv.can_admit(num_seqs)

    def admit(self, seq_id: int, token_ids: list[int], max_cached_tokens: int) -> int:
        return self.kv.admit(seq_id, token_ids, 0)

    def chunk_limit(self, seq_id: int, num_computed: int, num_prompt_tokens: int) -> int | None:
        return None

    def allocate(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        return self.kv.allocate(seq_id, num_computed, num_new_tokens)

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int, num_prompt_tokens: int) -> None:
        self.kv.commit(seq_id, token_ids, num_computed, num_prompt_tokens)

    def fork(self, parent_id: int, child_id: int) -> None:
        self.kv.fork(parent_id, child_id)
        self.encoder.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        self.kv.free(seq_id)
        self.encoder.unbind(seq_id)

    def retire(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        self.free(seq_id)

    def reset(self) -> None:
        self.kv.reset()
        self.encoder.reset()

    def take_ops(self) -> list[CacheOp]:
        return self.kv.take_ops()

    def step_finished(self) -> None:
        self.kv.step_finished()
