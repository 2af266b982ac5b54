"""Properties of the processors over random logits and random per-row settings (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quill.server.sampling.batch import SamplingBatch
from quill.server.sampling.params import SamplingParams
from quill.server.sampling.processors import (apply_banned_tokens, apply_logit_bias, apply_min_p,
                                              apply_presence_frequency_penalties, apply_repetition_penalty,
                                              apply_temperature, apply_top_k, apply_top_p)
from quill.server.sampling.sampler import process_logits, sample
from quill.server.sampling.table import build_batch
from tests.conftest import TEST_DEVICE

SETTINGS = settings(max_examples=60, deadline=None)
TOLERANCE = 1e-5  # float32 cumulative sums over <= 40 tokens


@st.composite
def logits_tensors(draw, distinct: bool = False, some_masked: bool = False, min_vocab: int = 2) -> torch.Tensor:
    """(B, V) float32 logits on the test device. distinct: no two equal in a row. some_masked: a few -inf,
    never among a row's 4 largest (so three banned tokens cannot empty a row)."""
    num_rows, vocab = draw(st.integers(1, 5)), draw(st.integers(min_vocab, 40))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.01, 1.0, 4.0, 30.0]))
    if distinct:
        ranks = torch.stack([torch.randperm(vocab, generator=generator) for _ in range(num_rows)])
        return (ranks.float() * (scale / vocab)).to(TEST_DEVICE)
    logits = torch.randn(num_rows, vocab, generator=generator) * scale
    if draw(st.booleans()):
        logits = logits.round()  # plenty of ties
    if some_masked:
        mask = torch.rand(num_rows, vocab, generator=generator) < 0.3
        mask.scatter_(1, logits.topk(min(4, vocab), dim=-1).indices, False)
        logits = logits.masked_fill(mask, float("-inf"))
    return logits.to(TEST_DEVICE)


@st.composite
def row_settings(draw, vocab: int) -> tuple[SamplingParams, list[int], list[int]]:
    params = SamplingParams(
        temperature=draw(st.one_of(st.just(0.0), st.floats(0.01, 10.0))),
        top_k=draw(st.integers(-1, vocab + 3)),
        top_p=draw(st.floats(0.0, 1.0, exclude_min=True)),
        min_p=draw(st.floats(0.0, 1.0)),
        repetition_penalty=draw(st.floats(0.05, 20.0)),
        presence_penalty=draw(st.floats(-2.0, 2.0)),
        frequency_penalty=draw(st.floats(-2.0, 2.0)),
        logit_bias=draw(st.dictionaries(st.integers(0, vocab - 1), st.floats(-100.0, 100.0), max_size=3)),
        min_tokens=draw(st.integers(0, 3)),
        stop_token_ids=draw(st.lists(st.integers(0, vocab - 1), max_size=2)),  # + 1 EOS: at most 3 banned
    )
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8))
    output = draw(st.lists(st.integers(0, vocab - 1), max_size=8))
    return params, prompt, output


@st.composite
def batches(draw) -> tuple[torch.Tensor, SamplingBatch]:
    logits = draw(logits_tensors(some_masked=draw(st.booleans()), min_vocab=4))
    num_rows, vocab = logits.shape
    rows = [draw(row_settings(vocab)) for _ in range(num_rows)]
    params, prompts, outputs = (list(column) for column in zip(*rows))
    eos = draw(st.lists(st.integers(0, vocab - 1), max_size=1))
    batch = build_batch(params, prompts, outputs, [None] * num_rows, vocab, TEST_DEVICE, eos_token_ids=eos)
    return logits, batch


def assert_normalized(logits: torch.Tensor) -> None:
    probs = logits.softmax(dim=-1)
    assert not probs.isnan().any()
    assert torch.allclose(probs.sum(dim=-1), torch.ones(logits.shape[0], device=logits.device), atol=TOLERANCE)


@SETTINGS
@given(batches())
def test_every_processor_keeps_the_distribution_normalized(case):
    logits, batch = case
    stages = []
    if batch.banned is not None:
        stages.append(lambda x: apply_banned_tokens(x, *batch.banned))
    if batch.bias is not None:
        stages.append(lambda x: apply_logit_bias(x, *batch.bias))
    if batch.seen_tokens is not None:
        stages.append(lambda x: apply_repetition_penalty(x, batch.seen_tokens, batch.repetition_penalty))
    if batch.output_counts is not None:
        stages.append(
            lambda x: apply_presence_frequency_penalties(
                x, batch.output_counts, batch.presence_penalty, batch.frequency_penalty
            )
        )
    stages += [
        lambda x: apply_temperature(x, batch.temperature),
        lambda x: apply_top_k(x, batch.top_k, batch.max_top_k or None),
        lambda x: apply_top_p(x, batch.top_p),
        lambda x: apply_min_p(x, batch.min_p),
    ]
    x = logits
    for stage in stages:
        x = stage(x)
        assert torch.isfinite(x).any(dim=-1).all()
        assert_normalized(x)
    if not batch.all_greedy:  # all-greedy batches stop after the penalties
        assert torch.equal(x, process_logits(logits, batch))


@SETTINGS
@given(batches())
def test_sampled_tokens_survive_the_filters(case):
    logits, batch = case
    processed = process_logits(logits, batch)
    chosen = sample(logits, batch).token_ids
    assert torch.isfinite(processed.gather(1, chosen.unsqueeze(1))).all()


@SETTINGS
@given(logits_tensors(distinct=True), st.data())
def test_top_k_keeps_exactly_k_without_ties(logits, data):
    num_rows, vocab = logits.shape
    top_k = torch.tensor(data.draw(st.lists(st.integers(-1, vocab + 3), min_size=num_rows, max_size=num_rows)),
                         device=TEST_DEVICE)
    kept = torch.isfinite(apply_top_k(logits, top_k)).sum(dim=-1)
    expected = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    assert torch.equal(kept, expected)
    # and they are the k largest
    for row in range(num_rows):
        largest = logits[row].topk(int(expected[row])).indices
        assert torch.isfinite(apply_top_k(logits, top_k)[row, largest]).all()


@SETTINGS
@given(logits_tensors(distinct=True), st.data())
def test_top_p_keeps_the_smallest_prefix_reaching_p(logits, data):
    num_rows, _ = logits.shape
    top_p = data.draw(st.lists(st.floats(0.0, 1.0, exclude_min=True), min_size=num_rows, max_size=num_rows))
    kept = torch.isfinite(apply_top_p(logits, torch.tensor(top_p, dtype=torch.float64, device=TEST_DEVICE)))
    for row, p in enumerate(top_p):
        order = logits[row].argsort(descending=True)
        num_kept = int(kept[row].sum())
        assert kept[row, order[:num_kept]].all(), "kept tokens are the most probable ones"
        if p == 1.0:
            assert num_kept == logits.shape[1]
            continue
        mass = logits[row].double().softmax(dim=-1)[order].cumsum(dim=0)  # mass of the top 1, 2, ... tokens
        assert mass[num_kept - 1] >= p - TOLERANCE, "the kept tokens reach p"
        assert num_kept == 1 or mass[num_kept - 2] < p + TOLERANCE, "one token fewer would not"


@SETTINGS
@given(logits_tensors(), st.data())
def test_min_p_keeps_exactly_the_tokens_above_the_threshold(logits, data):
    num_rows, _ = logits.shape
    min_p = data.draw(st.lists(st.floats(0.0, 1.0), min_size=num_rows, max_size=num_rows))
    kept = torch.isfinite(apply_min_p(logits, torch.tensor(min_p, device=TEST_DEVICE)))
    probs = logits.double().softmax(dim=-1)
    threshold = torch.tensor(min_p, dtype=torch.float64, device=TEST_DEVICE).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    clearly_above = probs >= threshold * (1 + 1e-5)
    clearly_below = probs < threshold * (1 - 1e-5)
    assert kept[clearly_above].all()
    # Below-threshold survivors are only tokens whose float32 probability is already 0 (a min_p
    # under float32's range rounds to 0 as well): they change nothing in the distribution.
    assert (logits.softmax(dim=-1)[kept & clearly_below] == 0).all()
    assert kept.any(dim=-1).all()
