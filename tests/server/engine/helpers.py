"""Driving an EngineCore to completion in tests."""

from __future__ import annotations

from server.engine.core import EngineCore


def run_to_completion(engine: EngineCore, max_steps: int = 10_000) -> dict[str, dict[int, dict]]:
    """request id -> output index -> {"text", "token_ids", "finish_reason", "score", "logprobs"}."""
    results: dict[str, dict[int, dict]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return results
        for out in engine.step():
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
    raise AssertionError("the engine did not finish")
