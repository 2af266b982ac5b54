"""The labels of `quill_cache_config_info` (metrics.py): a model's cache as an info gauge, as vLLM's
`vllm:cache_config_info`. The Gateway API Inference Extension's endpoint picker reads two of them for its
prefix-cache scorer: `block_size`, the granularity it hashes prompts in, and `num_gpu_blocks`, how many blocks a
server holds (the size of its per-server index of cached prefixes).

What each kind of model reports:
- K,V blocks (Transformers, a hybrid's attention layers, an encoder-decoder's decoder): `block_size` and
  `num_gpu_blocks`, the blocks sequences can use. vLLM's name, kept on the CPU too (vLLM's CPU build does), since
  that is the name every version of the picker reads.
- State slots only (LSTM, gated CNN, state-space): `block_size` alone, the interval at which prompts' prefix
  snapshots are taken, so that the picker hashes prompts where the server can resume them. No `num_gpu_blocks`:
  a snapshot holds a whole prefix, not a block of tokens, so no count of blocks would be true (the picker then
  sizes its index from its own configuration).
- Every model: `enable_prefix_caching`.

The engine tells the API process about its cache in words only (`describe_cache()`, the load log's; from an
engine process, `CoreInfo.cache_description`), so the K,V block count is read from those words.
tests/server/api/test_cache_config_info.py pins the wording, so a change of it fails there rather than dropping
the label in silence.
"""

from __future__ import annotations

import re

# KVBlocks.describe (engine/cache/state_kinds.py): "<tokens> tokens of K,V in blocks of <block_size>, attention ..."
_KV_BLOCKS = re.compile(r"\b(\d+) tokens of K,V in blocks of (\d+)\b")


def cache_config_labels(engine) -> dict[str, str]:
    """The info labels of one model's engine (an EngineFrontend, started), values as strings."""
    cache = engine.config.cache
    labels = {"block_size": str(cache.block_size), "enable_prefix_caching": str(cache.enable_prefix_caching)}
    kv = _KV_BLOCKS.search(engine.describe_cache())
    if kv is not None:
        tokens, block_size = int(kv.group(1)), int(kv.group(2))
        labels.update(block_size=str(block_size), num_gpu_blocks=str(tokens // block_size))
    return labels
