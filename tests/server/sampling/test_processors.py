"""Each processor against Hugging Face's on the same logits, and the penalties by hand."""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from quill.server.sampling.params import SamplingParams
from quill.server.sampling.processors import (apply_banned_tokens, apply_logit_bias, apply_min_p,
                                              apply_presence_frequency_penalties, apply_repetition_penalty,
                                              apply_temperature, apply_top_k, apply_top_p, token_counts)
from quill.server.sampling.sampler import process_logits
from quill.server.sampling.table import build_batch
from tests.conftest import TEST_DEVICE

B, V = 6, 64
NEG_INF = float("-inf")


@pytest.fixture
def logits() -> torch.Tensor:
    return (torch.randn(B, V, generator=torch.Generator().manual_seed(0)) * 3).to(TEST_DEVICE)


def assert_same_as_hf(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit on the CPU. On CUDA, PyTorch divides by a Python number (as transformers does) by multiplying
    with its reciprocal, and by a tensor (as a batch of temperatures needs) truly: one float32 ulp apart."""
    if got.device.type == "cpu":
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=2.5e-7, atol=0)


def full(value, dtype=torch.float32) -> torch.Tensor:
    return torch.full((B,), value, dtype=dtype, device=TEST_DEVICE)


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 1.9])
def test_temperature_matches_hf(logits, temperature):
    expected = TemperatureLogitsWarper(temperature)(None, logits)
    assert_same_as_hf(apply_temperature(logits, full(temperature)), expected)


def test_temperature_zero_rows_are_left_alone(logits):
    temperature = torch.tensor([0.0, 0.5, 0.0, 2.0, 1.0, 0.0], device=TEST_DEVICE)
    out = apply_temperature(logits, temperature)
    assert torch.equal(out[temperature == 0], logits[temperature == 0])
    assert torch.equal(out[1], logits[1] / 0.5)


@pytest.mark.parametrize("top_k", [1, 2, 10, V - 1, V, V + 5])
def test_top_k_matches_hf(logits, top_k):
    expected = TopKLogitsWarper(top_k)(None, logits)
    assert torch.equal(apply_top_k(logits, full(top_k, torch.long)), expected)
    assert torch.equal(apply_top_k(logits, full(top_k, torch.long), max_top_k=top_k), expected)


def test_top_k_keeps_every_tie_at_the_boundary():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]], device=TEST_DEVICE)
    out = apply_top_k(logits, torch.tensor([2], device=TEST_DEVICE))
    assert torch.isfinite(out).tolist() == [[True, True, True, True, False]]


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.999])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_top_p_matches_hf(logits, top_p, temperature):
    scaled = logits / temperature
    expected = TopPLogitsWarper(top_p)(None, scaled)
    assert torch.equal(apply_top_p(scaled, full(top_p, torch.float64)), expected)


def test_top_p_one_is_off_even_for_underflowing_tokens():
    logits = torch.tensor([[0.0, -200.0, -1e4]], device=TEST_DEVICE)  # softmax of the last two is 0 in float32
    assert torch.equal(apply_top_p(logits, torch.tensor([1.0], dtype=torch.float64, device=TEST_DEVICE)), logits)


@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.1, 0.5, 0.9, 1.0])
def test_min_p_matches_hf(logits, min_p):
    expected = MinPLogitsWarper(min_p)(None, logits)
    assert torch.equal(apply_min_p(logits, full(min_p)), expected)


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.2, 2.0])
def test_repetition_penalty_matches_hf(logits, penalty):
    seen_ids = torch.randint(0, V, (B, 20), generator=torch.Generator().manual_seed(1)).to(TEST_DEVICE)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(seen_ids, logits.clone())
    seen = token_counts(seen_ids.tolist(), V, TEST_DEVICE) > 0
    assert_same_as_hf(apply_repetition_penalty(logits, seen, full(penalty)), expected)


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]], device=TEST_DEVICE)
    seen = torch.tensor([[True, True, False, False]], device=TEST_DEVICE)
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0], device=TEST_DEVICE))
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_presence_and_frequency_penalties_by_hand():
    logits = torch.zeros(2, 5, device=TEST_DEVICE)
    counts = token_counts([[1, 1, 3], [4]], 5, TEST_DEVICE)
    presence, frequency = torch.tensor([0.5, -1.0], device=TEST_DEVICE), torch.tensor([0.25, 2.0], device=TEST_DEVICE)
    out = apply_presence_frequency_penalties(logits, counts, presence, frequency)
    # row 0: token 1 seen twice: -(0.5 + 2 * 0.25); token 3 once: -(0.5 + 0.25)
    # row 1: token 4 once: -(-1.0 + 2.0)
    assert out.tolist() == [[0.0, -1.0, 0.0, -0.75, 0.0], [0.0, 0.0, 0.0, 0.0, -1.0]]


def test_logit_bias_is_added_and_repeats_accumulate():
    logits = torch.zeros(2, 4, device=TEST_DEVICE)
    rows, token_ids = torch.tensor([0, 1, 1], device=TEST_DEVICE), torch.tensor([3, 0, 2], device=TEST_DEVICE)
    out = apply_logit_bias(logits, rows, token_ids, torch.tensor([5.0, -100.0, 0.5], device=TEST_DEVICE))
    assert out.tolist() == [[0.0, 0.0, 0.0, 5.0], [-100.0, 0.0, 0.5, 0.0]]
    assert logits.abs().sum() == 0  # input untouched


def test_banned_tokens_are_minus_infinity():
    on = dict(device=TEST_DEVICE)
    out = apply_banned_tokens(torch.zeros(2, 3, **on), torch.tensor([1, 1], **on), torch.tensor([0, 2], **on))
    assert out.tolist() == [[0.0, 0.0, 0.0], [NEG_INF, 0.0, NEG_INF]]


def test_token_counts_one_row_per_list_and_ids_past_the_vocab_dropped():
    counts = token_counts([[0, 2, 2, 9], [], [1]], 4, TEST_DEVICE)
    assert counts.tolist() == [[1, 0, 2, 0], [0, 0, 0, 0], [0, 1, 0, 0]]


def hf_pipeline(p: SamplingParams) -> LogitsProcessorList:
    """What HF's generate() would run for these settings (it leaves out the warpers that are off)."""
    steps = []
    if p.repetition_penalty != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.temperature != 1.0:
        steps.append(TemperatureLogitsWarper(p.temperature))
    if p.top_k > 0:
        steps.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        steps.append(TopPLogitsWarper(p.top_p))
    if p.min_p > 0.0:
        steps.append(MinPLogitsWarper(p.min_p))
    return LogitsProcessorList(steps)


def test_mixed_batch_matches_hf_row_by_row(logits):
    params = [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.9),
        SamplingParams(min_p=0.2, repetition_penalty=1.5),
        SamplingParams(temperature=0.5, top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.2),
        SamplingParams(),
        SamplingParams(temperature=2.0, top_k=V + 10, top_p=0.5, repetition_penalty=0.8),
    ]
    prompts = [[1, 2, 3], [4], [5, 5, 6], [7, 8], [9], [10, 11, 12]]
    outputs = [[13], [], [14, 1], [7], [20, 21], [3, 3]]
    batch = build_batch(params, prompts, outputs, [None] * B, V, TEST_DEVICE)
    out = process_logits(logits, batch)
    for row, p in enumerate(params):
        seen = torch.tensor([prompts[row] + outputs[row]], device=TEST_DEVICE)
        expected = hf_pipeline(p)(seen, logits[row : row + 1].clone())
        assert_same_as_hf(out[row : row + 1], expected)


def test_off_settings_leave_rows_unchanged(logits):
    batch = build_batch(
        [SamplingParams(top_k=3, top_p=0.5, min_p=0.3, repetition_penalty=1.5, presence_penalty=1.0)]
        + [SamplingParams()] * (B - 1),
        [[1, 2]] * B, [[3]] * B, [None] * B, V, TEST_DEVICE,
    )
    out = process_logits(logits, batch)
    assert torch.equal(out[1:], logits[1:])
    assert not torch.equal(out[0], logits[0])
