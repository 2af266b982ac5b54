"""Score restoration checkpoints as they are served: held-out sources through Quill's engine (greedy, and beam
search), BLEU (sacrebleu's defaults: 13a tokenization, case-sensitive) and exact-match rate against the lines as
printed, beside the baseline of copying the source unchanged.

`quill train` scores each restoration model so right after training it; `quill train --evaluate-only` re-scores
the saved checkpoints (cli.py).
"""

import asyncio
import time
from pathlib import Path

from quill.models.loading.checkpoint import LoadedModel, load_checkpoint
from quill.models.training.restoration import Pair
from quill.server.engine import AsyncEngine, EngineConfig, SchedulerConfig
from quill.server.sampling import SamplingParams

MAX_TOKENS = 96  # a held-out line is at most 40 words: ~60 pieces


def restore(loaded: LoadedModel, sources: list[str], beam_width: int | None = None, **beam_options) -> list[str]:
    """Every source submitted at once to an engine as the server runs it (its step thread, continuous batching
    under the server's default limits), greedy or with a beam search of `beam_width` (and `beam_options`, more
    SamplingParams: length or coverage penalties); each answer the text the server would send."""
    if beam_width:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, use_beam_search=True, beam_width=beam_width,
                                **beam_options)
    else:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    engine = AsyncEngine(loaded, EngineConfig(scheduler=SchedulerConfig(max_queue=max(len(sources), 1))))
    engine.start()
    try:
        return asyncio.run(_answers(engine, [loaded.seq2seq.source_ids(source) for source in sources], params))
    finally:
        engine.shutdown()


async def _answers(engine: AsyncEngine, sources: list[list[int]], params: SamplingParams) -> list[str]:
    streams = [engine.submit(source, params) for source in sources]
    answers = []
    for stream in streams:
        final = await stream.final()
        if final.error is not None:
            raise RuntimeError(f"request {final.request_id}: {final.error}")
        answers.append(next(o.text for o in final.outputs if o.index == 0))  # a beam search's best
    return answers


def score(hypotheses: list[str], references: list[str]) -> dict:
    import sacrebleu  # a training dependency (pyproject's test extra), not the server's

    bleu = sacrebleu.BLEU()
    return {
        "bleu": round(bleu.corpus_score(hypotheses, [references]).score, 2),
        "exact_match": round(sum(h == r for h, r in zip(hypotheses, references)) / len(references), 4),
        "bleu_signature": str(bleu.get_signature()),
    }


def copy_baseline(pairs: list[Pair]) -> dict:
    return score([p.source for p in pairs], [p.target for p in pairs])


def evaluate_checkpoint(directory: Path, pairs: list[Pair], beam_width: int | None = 4) -> dict:
    """Greedy (and, with `beam_width`, beam) scores of one checkpoint on `pairs`, with a few examples."""
    loaded = load_checkpoint(directory, device="cpu", dtype="float32")
    sources, references = [p.source for p in pairs], [p.target for p in pairs]
    scores = {"lines": len(pairs), "dtype": "float32 (the float16 weights, read as the server reads them on a CPU)"}
    for name, width in [("greedy", None)] + ([(f"beam{beam_width}", beam_width)] if beam_width else []):
        started = time.perf_counter()
        hypotheses = restore(loaded, sources, width)
        scores[name] = {**score(hypotheses, references), "seconds": round(time.perf_counter() - started, 1)}
        if width is None:
            scores["examples"] = [{"source": s, "restored": h, "reference": r}
                                  for s, h, r in list(zip(sources, hypotheses, references))[:5]]
    return scores
