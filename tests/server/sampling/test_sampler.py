import pytest
import torch

from quill.server.sampling.batch import new_generator
from quill.server.sampling.params import SamplingParams
from quill.server.sampling.processors import apply_top_k, apply_top_p
from quill.server.sampling.sampler import process_logits, prompt_logprobs, sample
from quill.server.sampling.table import build_batch
from tests.conftest import TEST_DEVICE

NEG_INF = float("-inf")


def build(params, vocab, prompts=None, outputs=None, generators=None, eos_token_ids=()):
    rows = len(params)
    return build_batch(
        params,
        prompts if prompts is not None else [[0]] * rows,
        outputs if outputs is not None else [[]] * rows,
        generators if generators is not None else [None] * rows,
        vocab,
        TEST_DEVICE,
        eos_token_ids=eos_token_ids,
    )


def random_logits(rows, vocab, seed=0, scale=2.0):
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale).to(TEST_DEVICE)


def test_greedy_is_argmax():
    logits = random_logits(8, 100)
    out = sample(logits, build([SamplingParams(temperature=0.0)] * 8, 100))
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))


def test_greedy_takes_the_argmax_after_penalties_and_bias():
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0]], device=TEST_DEVICE)
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0, logit_bias={3: 4.5})]
    out = sample(logits, build(params, 4, prompts=[[0]]))  # 5 / 2 = 2.5 < 4 < 4.5
    assert out.token_ids.tolist() == [3]


def test_greedy_and_random_rows_mix():
    logits = random_logits(6, 50)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=5.0)] * 3
    out = sample(logits, build(params, 50))
    greedy_rows = torch.tensor([0, 2, 4])
    assert torch.equal(out.token_ids[greedy_rows], logits[greedy_rows].argmax(dim=-1))


def test_logits_are_not_modified():
    logits = random_logits(3, 20)
    before = logits.clone()
    params = [SamplingParams(top_k=3, top_p=0.5, repetition_penalty=2.0, logit_bias={1: 5.0}, min_tokens=2)] * 3
    sample(logits, build(params, 20, outputs=[[1, 2]] * 3, eos_token_ids=[0]))
    assert torch.equal(logits, before)


def run_steps(row_params, seed, others, position, steps=6, vocab=300):
    """The tokens a seeded row draws over `steps` steps, placed at `position` among `others`."""
    generator = new_generator(seed, TEST_DEVICE)
    other_generators = [new_generator(p.seed, TEST_DEVICE) if p.seed is not None else None for p in others]
    tokens = []
    for step in range(steps):
        params = list(others)
        params.insert(position, row_params)
        generators = list(other_generators)
        generators.insert(position, generator)
        logits = random_logits(len(params), vocab, seed=100 + step, scale=0.5)
        logits[position] = random_logits(1, vocab, seed=step)[0]  # the row's own logits, the same in every run
        tokens.append(int(sample(logits, build(params, vocab, generators=generators)).token_ids[position]))
    return tokens


OTHERS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, seed=7),
    SamplingParams(temperature=1.5),
    SamplingParams(top_k=5, seed=123),
    SamplingParams(top_p=0.5),
    SamplingParams(temperature=0.3, seed=99),
    SamplingParams(min_p=0.1),
]


def test_same_seed_same_tokens_alone_or_anywhere_in_a_batch():
    row = SamplingParams(temperature=1.0, seed=42)
    alone = run_steps(row, 42, [], 0)
    assert len(set(alone)) > 1  # the row really samples
    for position in (0, 3, 7):
        assert run_steps(row, 42, OTHERS, position) == alone
    torch.manual_seed(1234)  # a different global RNG state does not matter either
    assert run_steps(row, 42, OTHERS[::-1], 5) == alone


def test_different_seeds_draw_differently():
    row = SamplingParams(temperature=1.0)
    flat = torch.zeros(2, 1000, device=TEST_DEVICE)
    draws = [
        [int(sample(flat, build([row], 1000, generators=[gen])).token_ids[0]) for _ in range(5)]
        for gen in (new_generator(1, TEST_DEVICE), new_generator(2, TEST_DEVICE))
    ]
    assert draws[0] != draws[1]  # equal with probability 1e-15


def test_seeded_greedy_row_does_not_advance_its_generator():
    generator = new_generator(5, TEST_DEVICE)
    state = generator.get_state()
    sample(random_logits(1, 10), build([SamplingParams(temperature=0.0, seed=5)], 10, generators=[generator]))
    assert torch.equal(generator.get_state(), state)


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    observed = torch.bincount(tokens, minlength=probs.shape[0]).double()
    expected = probs.double() * tokens.shape[0]
    support = expected > 0
    assert observed[~support].sum() == 0, "drew a token of probability 0"
    return float(((observed[support] - expected[support]) ** 2 / expected[support]).sum())


# 0.1% critical values of chi-square: a correct sampler fails one run in a thousand, and these runs are seeded.
CHI2_CRITICAL = {5: 20.52, 3: 16.27}


def test_sampling_frequencies_match_the_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5], device=TEST_DEVICE)
    out = sample(logits.expand(4000, -1), build([SamplingParams(temperature=0.9)] * 4000, 6))
    assert chi_square(out.token_ids, (logits / 0.9).softmax(dim=-1)) < CHI2_CRITICAL[5]


def test_sampling_frequencies_match_the_filtered_distribution():
    torch.manual_seed(1)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5]], device=TEST_DEVICE)
    top_k, top_p = torch.tensor([5], device=TEST_DEVICE), torch.tensor([0.9], dtype=torch.float64, device=TEST_DEVICE)
    filtered = apply_top_p(apply_top_k(logits, top_k), top_p)
    probs = filtered.softmax(dim=-1)[0]
    assert int((probs > 0).sum()) == 4  # top-k drops one token, top-p another
    out = sample(logits.expand(4000, -1), build([SamplingParams(top_k=5, top_p=0.9)] * 4000, 6))
    assert chi_square(out.token_ids, probs) < CHI2_CRITICAL[3]


def test_seeded_row_draws_follow_the_distribution_too():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5]], device=TEST_DEVICE)
    generator = new_generator(3, TEST_DEVICE)
    batch = build([SamplingParams()], 6, generators=[generator])
    tokens = torch.tensor([int(sample(logits, batch).token_ids[0]) for _ in range(2000)], device=TEST_DEVICE)
    assert chi_square(tokens, logits[0].softmax(dim=-1)) < CHI2_CRITICAL[5]


def test_logprobs_are_those_of_the_raw_distribution():
    logits = random_logits(4, 30)
    params = [
        SamplingParams(temperature=0.3, top_k=3, logprobs=5),
        SamplingParams(temperature=0.0, repetition_penalty=3.0),
        SamplingParams(min_p=0.5, logprobs=2),
        SamplingParams(presence_penalty=2.0, logit_bias={4: 50.0}),
    ]
    out = sample(logits, build(params, 30, outputs=[[1, 2]] * 4))
    raw = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(out.logprobs, raw.gather(1, out.token_ids.unsqueeze(1)).squeeze(1), atol=1e-5)
    assert out.token_ids[3] == 4  # the bias wins the draw, yet its logprob is the model's
    assert out.top_logprobs.shape == out.top_ids.shape == (4, 5)  # the widest request
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    expected_values, expected_ids = raw.topk(5, dim=-1)
    assert torch.equal(out.top_ids, expected_ids)
    assert torch.allclose(out.top_logprobs, expected_values, atol=1e-5)


def test_no_top_logprobs_unless_asked():
    out = sample(random_logits(2, 10), build([SamplingParams(), SamplingParams(logprobs=0)], 10))
    assert out.top_logprobs is None and out.top_ids is None
    assert out.logprobs.shape == (2,)


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    params = [SamplingParams(min_tokens=3, stop_token_ids=[7])] * 3 + [SamplingParams(min_tokens=3, ignore_eos=True)]
    outputs = [[], [1, 2], [1, 2, 3], []]
    processed = process_logits(torch.zeros(4, 10, device=TEST_DEVICE), build(params, 10, outputs=outputs, eos_token_ids=[0, 9]))
    banned = processed == NEG_INF
    assert banned[0].nonzero().flatten().tolist() == [0, 7, 9]
    assert banned[1].nonzero().flatten().tolist() == [0, 7, 9]
    assert not banned[2].any()  # three tokens generated: free to stop
    assert not banned[3].any()  # ignore_eos: EOS is an ordinary token


def test_min_tokens_keeps_a_greedy_row_off_eos():
    logits = torch.tensor([[10.0, 1.0, 0.0]], device=TEST_DEVICE)
    params = [SamplingParams(temperature=0.0, min_tokens=1)]
    assert sample(logits, build(params, 3, eos_token_ids=[0])).token_ids.tolist() == [1]


def test_penalties_count_prompt_for_repetition_and_output_for_presence():
    logits = torch.ones(2, 5, device=TEST_DEVICE)
    params = [SamplingParams(repetition_penalty=2.0), SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)]
    processed = process_logits(logits, build(params, 5, prompts=[[0], [0]], outputs=[[1, 1], [1, 1]]))
    assert processed[0].tolist() == [0.5, 0.5, 1.0, 1.0, 1.0]
    assert processed[1].tolist() == [1.0, -1.0, 1.0, 1.0, 1.0]  # 1 - (1.0 + 2 * 0.5); the prompt is not penalized


def test_prompt_logprobs_score_each_token_given_its_prefix():
    logits = random_logits(5, 12)  # row t predicts token t + 1
    token_ids = [3, 1, 4, 1, 5]
    scored = prompt_logprobs(logits, token_ids, top_n=3)
    expected = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(scored.logprobs, torch.stack([expected[t, token_ids[t + 1]] for t in range(4)]))
    values, ids = expected[:4].topk(3, dim=-1)
    assert torch.equal(scored.top_ids, ids)
    assert torch.allclose(scored.top_logprobs, values)
    # Without the last row (it predicts the first generated token) the answer is the same.
    assert torch.equal(prompt_logprobs(logits[:4], token_ids, top_n=0).logprobs, scored.logprobs)
    assert prompt_logprobs(logits, token_ids, top_n=0).top_ids is None


def test_prompt_logprobs_of_a_one_token_prompt_are_empty():
    assert prompt_logprobs(random_logits(1, 12), [3], top_n=2).logprobs.shape == (0,)


def test_prompt_logprobs_need_enough_rows():
    with pytest.raises(ValueError):
        prompt_logprobs(random_logits(2, 12), [1, 2, 3, 4], top_n=0)


@pytest.mark.parametrize("width", [5, 255, 256, 300, 32000, 50257])  # below two chunks, whole chunks, a tail
def test_the_cpu_greedy_pick_is_maxs_first_highest_entry(width):
    """Chunked on the CPU (amax per chunk, then one chunk searched): the same index as `max`, the first of tied
    maxima, whether they lie in one chunk, in two, or in the last, shorter one, and NaN counting as highest."""
    from quill.server.sampling.sampler import CHUNK, greedy_ids

    g = torch.Generator().manual_seed(width)
    scores = torch.randn(8, width, generator=g)
    scores[1, :] = 0.0  # all tied: the first
    scores[2, [width // 3, width - 1]] = 9.0  # tied across chunks
    scores[3, [width - 1, width - 2]] = 9.0  # tied in the last chunk
    scores[4, width // 2] = float("nan")
    scores[5, 0] = 9.0  # the very first entry
    if width > CHUNK:
        scores[6, [CHUNK - 1, CHUNK]] = 9.0  # tied across a chunk boundary
    assert torch.equal(greedy_ids(scores), scores.max(dim=-1).indices)
    assert torch.equal(greedy_ids(scores[:, : width - 1]), scores[:, : width - 1].max(dim=-1).indices)
