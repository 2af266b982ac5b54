"""Reference decoding for the toolkit translation models' tests: greedy and beam search over a reference model that
recomputes every prefix from scratch (no incremental state), against the same requests run through Quill's engine
(continuous batching, encoder outputs in blocks, decoder state in slots or blocks, beams forking it).

The beam search keeps Quill's rules (quill/server/engine/beam_search.py, itself held to transformers' generate by
tests/server/engine): what is under test here is the model's incremental state, not the bookkeeping."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from quill.server.engine.beam_search import BeamSearch
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.sampling import SamplingParams

# prefix (decoder input ids, start token first) -> (V,) log-probabilities of the next token
NextLogprobs = Callable[[list[int]], torch.Tensor]


def never_pad(logprobs: torch.Tensor, pad: int = 1) -> torch.Tensor:
    """fairseq's SequenceGenerator: pad's log-probability set to -inf after normalising, at every step."""
    logprobs = logprobs.clone()
    logprobs[pad] = float("-inf")
    return logprobs


def reference_greedy(next_logprobs: NextLogprobs, start: int, max_tokens: int, eos: int) -> list[int]:
    out: list[int] = []
    while len(out) < max_tokens:
        out.append(int(next_logprobs([start] + out).argmax()))
        if out[-1] == eos:
            break
    return out


def reference_beam(next_logprobs: NextLogprobs, start: int, max_tokens: int, eos: int, width: int, n: int,
                   length_penalty: float = 1.0, penalty: Callable[[list[int]], float] | None = None,
                   stepwise: bool = False) -> list[tuple[list[int], float]]:
    """The n best (tokens, length-penalised score). `penalty`: prefix (start token first) -> the coverage penalty of
    the beam that has computed it, taken off the score of a hypothesis ending at the next token, and with
    `stepwise` off every beam's score before each step's candidates are ranked (OpenNMT's -stepwise_penalty)."""
    search = BeamSearch(width, max_tokens, [eos], length_penalty, stepwise=stepwise)
    beams: list[list[int]] = [[]]
    while True:
        logprobs = torch.stack([next_logprobs([start] + beam).float() for beam in beams])
        penalties = None if penalty is None else [penalty([start] + beam) for beam in beams]
        base = torch.tensor(search.scores) - (torch.tensor(penalties) if stepwise else 0.0)
        total = logprobs + base[:, None]
        top = total.flatten().topk(min(search.num_candidates, total.numel()))
        step = search.advance(top.values.tolist(), top.indices.tolist(), logprobs.shape[1], beams, penalties)
        if step.done:
            return [(h.token_ids, h.score) for h in search.finished[:n]]
        beams = [beams[parent] + [token] for parent, token, _ in step.running]


def engine_outputs(loaded, requests: dict[str, tuple[list[int], SamplingParams]], graph_capture=None,
                   **cache) -> dict:
    """Every request (id -> (source ids, params)) at once through an engine over `loaded` (its decode steps
    replayed through `graph_capture` where one is given), to its end: request id -> [(token ids, score)] by output
    index."""
    return run_to_end(EngineCore(loaded, EngineConfig(cache=CacheConfig(**cache)), graph_capture=graph_capture),
                      requests)


def run_to_end(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict:
    """engine_outputs through a given engine."""
    start = core.loaded.model.config.decoder_start_token_id
    for request_id, (source, params) in requests.items():
        core.add_request(request_id, [start], params, encoder_token_ids=source)
    tokens: dict = {}
    finals: dict = {}
    while core.has_work():
        for out in core.step():
            assert out.error is None, out.error
            for o in out.outputs:
                tokens.setdefault((out.request_id, o.index), []).extend(o.token_ids)
                if out.finished:
                    finals.setdefault(out.request_id, {})[o.index] = (tokens[out.request_id, o.index], o.score)
    return {rid: [outs[i] for i in sorted(outs)] for rid, outs in finals.items()}


def check_against_reference(loaded, sources: list[list[int]], next_logprobs_of: Callable[[list[int]], NextLogprobs],
                            max_tokens: int = 10, width: int = 3, n: int = 2, graph_capture=None, **cache) -> None:
    """Greedy and beam answers for `sources`, all in one busy engine, equal the reference's for each source alone.
    `next_logprobs_of(source)`: the reference's next-token function for that source."""
    eos = loaded.eos_token_ids[0]
    start = loaded.model.config.decoder_start_token_id
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0)
    beam = SamplingParams(max_tokens=max_tokens, temperature=0, use_beam_search=True, beam_width=width, n=n)
    requests = {}
    for i, source in enumerate(sources):
        requests[f"greedy{i}"] = (source, greedy)
        requests[f"beam{i}"] = (source, beam)
    got = engine_outputs(loaded, requests, graph_capture, **cache)
    for i, source in enumerate(sources):
        step = next_logprobs_of(source)
        assert got[f"greedy{i}"][0][0] == reference_greedy(step, start, max_tokens, eos), f"greedy, source {i}"
        expected = reference_beam(step, start, max_tokens, eos, width, n)
        assert [tokens for tokens, _ in got[f"beam{i}"]] == [tokens for tokens, _ in expected], f"beam, source {i}"
        scores = [score for _, score in got[f"beam{i}"]], [score for _, score in expected]
        assert scores[0] == pytest.approx(scores[1], abs=1e-3), f"beam scores, source {i}: {scores}"

