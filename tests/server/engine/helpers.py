"""Driving an EngineCore to completion in tests."""

from __future__ import annotations

from quill.server.engine.cache import hybrid_cache, kv_blocks, prefix, state_slots
from quill.server.engine.core import EngineCore


def run_to_completion(engine: EngineCore, max_steps: int = 10_000) -> dict[str, dict[int, dict]]:
    """request id -> output index -> {"text", "token_ids", "finish_reason", "score", "logprobs"}."""
    results: dict[str, dict[int, dict]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return results
        collect(results, engine.step())
    raise AssertionError("the engine did not finish")


def collect(results: dict[str, dict[int, dict]], outputs) -> None:
    """Add one step's outputs to `results` (see run_to_completion)."""
    for out in outputs:
        for c in out.outputs:
            r = results.setdefault(out.request_id, {}).setdefault(
                c.index, {"text": "", "token_ids": [], "finish_reason": None, "score": None, "logprobs": []}
            )
            r["text"] += c.text
            r["token_ids"] += c.token_ids
            r["logprobs"] += c.logprobs or []
            r["finish_reason"] = c.finish_reason
            r["score"] = c.score
            r["cumulative_logprob"] = c.cumulative_logprob
        if out.prompt_logprobs is not None:
            results.setdefault(out.request_id, {})["prompt_logprobs"] = out.prompt_logprobs


def scripted_engine(tokenizer, state_kind: str = "paged_kv", logits_fn=None, max_num_seqs: int = 16,
                    budget: int = 64, block_size: int = 4, num_blocks: int = 256, eos: int = 0,
                    async_scheduling: bool = False, kv_events=None) -> EngineCore:
    """An engine over `ScriptedModel`: no model compute, logits chosen by `logits_fn` (or a fixed table)."""
    import torch

    from quill.models.loading.checkpoint import LoadedModel
    from quill.models.families.scripted import ScriptedConfig, ScriptedModel
    from quill.server.engine.core import CacheConfig, EngineConfig
    from quill.server.engine.scheduler import SchedulerConfig

    from tests.conftest import TEST_DEVICE

    model = ScriptedModel(ScriptedConfig(tokenizer.vocab_size, state_kind=state_kind), logits_fn=logits_fn)
    loaded = LoadedModel("scripted", None, "scripted", model.to(TEST_DEVICE), tokenizer, [eos], TEST_DEVICE,
                         torch.float32)
    return EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget),
        CacheConfig(block_size=block_size, num_blocks=num_blocks),
        async_scheduling=async_scheduling, kv_events=kv_events,
    ))


def record_hashed_blocks(monkeypatch) -> list:
    """Every block key the cache managers hash from now on (one entry per hashing), in a list."""
    hashed = []

    def recording(*args, **kwargs):
        keys = prefix.block_keys(*args, **kwargs)
        hashed.extend(keys)
        return keys

    for module in (hybrid_cache, kv_blocks, state_slots):
        monkeypatch.setattr(module, "block_keys", recording)
    return hashed
