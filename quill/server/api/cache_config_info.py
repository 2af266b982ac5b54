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

The engine says how many K,V blocks it holds (`num_kv_blocks`; from an engine process, through `CoreInfo`).
"""

from __future__ import annotations


def cache_config_labels(engine) -> dict[str, str]:
    """The info labels of one model's engine (an EngineFrontend, started), values as strings."""
    cache = engine.config.cache
    labels = {"block_size": str(cache.block_size), "enable_prefix_caching": str(cache.enable_prefix_caching)}
    if engine.num_kv_blocks is not None:
        labels["num_gpu_blocks"] = str(engine.num_kv_blocks)
    return labels
