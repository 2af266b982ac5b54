"""Sampling on (fake) CUDA logits: every processor, the pick, log-probabilities, beam candidates and prompt
scores keep to the logits' device (tests/fake_cuda.py).

Not covered: seeded rows. A CPU build of PyTorch cannot make a CUDA generator, and fake tensors refuse
an explicit generator; requests with a seed get theirs from `new_generator(seed, model device)`.
"""

from __future__ import annotations

import torch

from quill.server.sampling import SamplingBatch, SamplingParams, build_batch, prompt_logprobs, sample
from quill.server.sampling.beam import BeamRequest, beam_candidates
from tests.fake_cuda import CUDA, assert_on_cuda, fake_cuda

V = 50
EOS = 0

# Between them, every processor of process_logits and both picks (argmax and the exponential race).
MIXED = [
    SamplingParams(temperature=0.0, logprobs=3),
    SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, n=2),
    SamplingParams(temperature=0.7, logit_bias={3: 5.0, 9: -100.0}, min_tokens=2, stop_token_ids=[7], logprobs=0),
]


def cuda_batch(params: list[SamplingParams]) -> SamplingBatch:
    """The settings gathered on CUDA from the engine's per-slot table, with token history for the penalties."""
    rows = len(params)
    prompts = [[1, 2, 3, 2]] * rows
    outputs = [[4, 4, 9]] + [[]] * (rows - 1)
    return build_batch(params, prompts, outputs, [None] * rows, V, CUDA, eos_token_ids=[EOS])


def test_mixed_settings_sample_on_cuda():
    with fake_cuda():
        batch = cuda_batch(MIXED)
        assert batch.seen_tokens is not None and batch.output_counts is not None
        assert batch.bias is not None and batch.banned is not None and batch.max_top_k == 5
        tensors = [batch.temperature, batch.is_greedy, batch.top_k, batch.top_p, batch.min_p,
                   batch.repetition_penalty, batch.presence_penalty, batch.frequency_penalty,
                   batch.seen_tokens, batch.output_counts, *batch.bias, *batch.banned]
        assert_on_cuda(*tensors)
        out = sample(torch.empty(len(MIXED), V, device=CUDA), batch)
        assert_on_cuda(out.token_ids, out.logprobs, out.top_logprobs, out.top_ids)
        assert out.token_ids.shape == (4,) and out.top_ids.shape == (4, 3)


def test_all_greedy_rows_without_logprobs_sample_on_cuda():
    with fake_cuda():
        batch = cuda_batch([SamplingParams(temperature=0.0, repetition_penalty=1.1)] * 3)
        out = sample(torch.empty(3, V, dtype=torch.bfloat16, device=CUDA), batch)
        assert_on_cuda(out.token_ids, out.logprobs)
        assert out.top_ids is None


def test_beam_candidates_on_cuda():
    with fake_cuda():
        requests = [BeamRequest(rows=[0], scores=[0.0], num_candidates=4),
                    BeamRequest(rows=[3, 1, 2], scores=[-1.0, -1.5, -2.5], num_candidates=6, banned=(EOS,))]
        values, indices = beam_candidates(torch.empty(4, V, device=CUDA), requests)
        assert_on_cuda(values, indices)
        assert values.shape == indices.shape == (2, 6)


def test_prompt_scores_on_cuda():
    with fake_cuda():
        scored = prompt_logprobs(torch.empty(6, V, device=CUDA), [5, 6, 7, 8, 9, 10], top_n=2)
        assert_on_cuda(scored.logprobs, scored.top_logprobs, scored.top_ids)
        assert scored.logprobs.shape == (5,) and scored.top_ids.shape == (5, 2)
