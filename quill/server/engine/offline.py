"""One prompt through the engine, without a server: what `quill generate` runs."""

from __future__ import annotations

from collections.abc import Iterator

from quill.models.loading.checkpoint import LoadedModel
from quill.server.sampling import SamplingParams

from .core import EngineConfig, EngineCore


def generate(loaded: LoadedModel, prompt: str, params: SamplingParams) -> Iterator[str]:
    """Yield text deltas of the first output as the engine produces them."""
    ids = loaded.tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt is empty after tokenization")
    limit = loaded.max_seq_len
    if limit is not None and len(ids) + params.max_tokens > limit:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's context of {limit} tokens"
        )
    engine = EngineCore(loaded, EngineConfig())
    engine.add_request("generate", ids, params)
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(out.error)
            for completion in out.outputs:
                if completion.index == 0 and completion.text:
                    yield completion.text
