"""Which part of a decoder-only Transformer one rank of a tensor-parallel group holds.

Megatron's split, as vLLM and nano-vllm make it: the q, k, v projection and the MLP's first layer are split by
output rows (each rank its heads, its share of the feed-forward width), the attention's output and the MLP's
second layer by input columns (each rank a partial sum, all-reduced); the embedding and the output layer by
vocabulary rows. K,V heads split like the q heads where there are at least as many as ranks, else each rank holds
the one its q heads read (replicated over `size // n_kv_heads` ranks). The vocabulary needs no divisibility: every
rank holds ceil(V / size) rows, the last one's tail zeros that no token looks up and whose logits are cut off.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..families.transformer import TransformerConfig

_LAYER_PARAM = re.compile(r"^layers\.\d+\.(attn\.qkv|attn\.out|mlp\.up|mlp\.down)\.(weight|bias)$")
VOCAB_PARAMS = ("embed.weight", "lm_head.weight", "lm_bias")
# The row-parallel layers' biases: rank 0 alone adds them, so that the all-reduce counts them once.
ROW_PARALLEL_BIASES = ("attn.out", "mlp.down")


def check_shardable(config: TransformerConfig, size: int) -> None:
    """ValueError naming what cannot be split over `size` ranks."""
    if size < 1:
        raise ValueError(f"the tensor-parallel size must be at least 1, not {size}")
    problems = []
    if config.n_heads % size:
        problems.append(f"its {config.n_heads} attention heads do not split evenly")
    if config.n_kv_heads % size and size % config.n_kv_heads:
        problems.append(f"its {config.n_kv_heads} K,V heads neither split evenly nor replicate evenly "
                        "(the size must divide them or be a multiple of them)")
    if config.d_ff % size:
        problems.append(f"its feed-forward width {config.d_ff} does not split evenly")
    if problems:
        raise ValueError(f"this model cannot be split over tensor-parallel size {size}: " + "; ".join(problems))


@dataclass(frozen=True)
class ShardPlan:
    config: TransformerConfig  # the whole model's
    rank: int
    size: int

    def __post_init__(self):
        check_shardable(self.config, self.size)
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in a group of {self.size}")

    @property
    def heads(self) -> range:
        """This rank's q heads."""
        n = self.config.n_heads // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    @property
    def kv_heads(self) -> range:
        """This rank's K,V heads: its share, or the one head its q heads read where there are fewer than ranks."""
        kv, size = self.config.n_kv_heads, self.size
        if kv >= size:
            n = kv // size
            return range(self.rank * n, (self.rank + 1) * n)
        first = self.rank // (size // kv)
        return range(first, first + 1)

    @property
    def ffn(self) -> range:
        n = self.config.d_ff // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    @property
    def vocab_shard(self) -> int:
        """Rows of the vocabulary every rank holds (the last rank's past the vocabulary are zeros)."""
        return -(-self.config.vocab_size // self.size)

    @property
    def vocab(self) -> range:
        """The token ids this rank's rows hold."""
        start = self.rank * self.vocab_shard
        return range(min(start, self.config.vocab_size), min(start + self.vocab_shard, self.config.vocab_size))

    def local_config(self) -> TransformerConfig:
        """The config of this rank's model: its heads, its share of the feed-forward width and the vocabulary, the
        head size written out (by default it follows d_model // n_heads, which would change)."""
        c = self.config
        return dataclasses.replace(c, n_heads=len(self.heads), n_kv_heads=len(self.kv_heads), head_dim=c.head_dim,
                                   d_ff=len(self.ffn), vocab_size=self.vocab_shard)

    def drops_bias(self, param: str) -> bool:
        """Whether this rank's model goes without `param`: a row-parallel layer's bias on any rank but 0."""
        return self.rank > 0 and param.endswith(".bias") and param.rpartition(".")[0].endswith(ROW_PARALLEL_BIASES)

    def shard_of(self, param: str) -> tuple[int, list[range]] | None:
        """(the dimension of the whole parameter this rank takes a part of, the index ranges it takes along it, in
        order), or None for a parameter every rank holds whole."""
        c, hd = self.config, self.config.head_dim
        if param in VOCAB_PARAMS:
            return 0, [self.vocab]
        match = _LAYER_PARAM.match(param)
        if match is None:
            return None  # norms, learned positions, q/k norms (one over head_dim, shared by the heads)
        layer, kind = match.groups()
        heads, kv, ffn = self.heads, self.kv_heads, self.ffn
        if layer == "attn.qkv":  # rows [q; k; v]
            k_start, v_start = c.n_heads * hd, (c.n_heads + c.n_kv_heads) * hd
            return 0, [range(heads.start * hd, heads.stop * hd), range(k_start + kv.start * hd, k_start + kv.stop * hd),
                       range(v_start + kv.start * hd, v_start + kv.stop * hd)]
        if layer == "mlp.up":  # rows [gate; up] in a gated MLP
            parts = [ffn] + ([range(c.d_ff + ffn.start, c.d_ff + ffn.stop)] if c.gated_mlp else [])
            return 0, parts
        if kind == "bias":
            return None  # rank 0's whole (drops_bias: the others hold none)
        if layer == "attn.out":
            return 1, [range(heads.start * hd, heads.stop * hd)]
        return 1, [ffn]  # mlp.down
