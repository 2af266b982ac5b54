import math

import numpy as np
import pytest

from quill.models.training.bigram import KneserNeyBigram, ney_discount


def reference_probability(tokens: list[int], vocab_size: int, v: int, w: int) -> float:
    """Interpolated Kneser-Ney written out with loops, straight from the formula."""
    pairs = list(zip(tokens[:-1], tokens[1:]))
    distinct = set(pairs)
    counts = {pair: pairs.count(pair) for pair in distinct}
    d2 = ney_discount(np.array(list(counts.values())))
    continuation = [sum(1 for (_, b) in distinct if b == word) for word in range(vocab_size)]
    d1 = ney_discount(np.array(continuation))
    seen_words = sum(1 for c in continuation if c > 0)
    p_cont = max(continuation[w] - d1, 0) / len(distinct) + d1 * seen_words / len(distinct) / vocab_size
    c_v = sum(c for (a, _), c in counts.items() if a == v)
    if c_v == 0:
        return p_cont
    types_v = sum(1 for (a, _) in distinct if a == v)
    return max(counts.get((v, w), 0) - d2, 0) / c_v + d2 * types_v / c_v * p_cont


def test_every_context_is_a_distribution_over_the_vocabulary():
    rng = np.random.default_rng(0)
    vocab_size = 12
    tokens = rng.integers(0, vocab_size - 2, size=300)  # ids 10 and 11 never occur: unseen context and word
    model = KneserNeyBigram.fit(tokens, vocab_size)
    for context in range(vocab_size):
        distribution = model.next_token_distribution(context)
        assert distribution.shape == (vocab_size,)
        assert np.all(distribution > 0)
        assert distribution.sum() == pytest.approx(1.0, abs=1e-12)


def test_matches_the_formula_written_out():
    tokens = [0, 1, 2, 1, 2, 3, 1, 2, 0, 4, 1, 1, 2, 3, 0]
    vocab_size = 6  # id 5 unseen
    model = KneserNeyBigram.fit(np.array(tokens), vocab_size)
    for v in range(vocab_size):
        for w in range(vocab_size):
            expected = reference_probability(tokens, vocab_size, v, w)
            assert model.probabilities(np.array([v]), np.array([w]))[0] == pytest.approx(expected, rel=1e-12)


def test_perplexity_is_exp_of_mean_negative_log_probability():
    tokens = np.array([0, 1, 2, 1, 2, 3, 1, 2, 0])
    held_out = np.array([0, 1, 2, 3, 3])
    model = KneserNeyBigram.fit(tokens, 5)
    log_probs = [math.log(model.next_token_distribution(a)[b]) for a, b in zip(held_out, held_out[1:])]
    by_hand = math.exp(-np.mean(log_probs))
    assert model.perplexity(held_out) == pytest.approx(by_hand, rel=1e-12)


def test_beats_a_unigram_model_on_a_tiny_handmade_corpus():
    words = "<s> the cat sat on the mat . the dog sat on the log . a cat ran to the dog .".split()
    vocabulary = {word: i for i, word in enumerate(dict.fromkeys(words))}
    train = np.array([vocabulary[w] for w in words * 5])
    held_out = np.array([vocabulary[w] for w in "<s> the dog sat on the mat . a cat sat on the log .".split()])
    bigram = KneserNeyBigram.fit(train, len(vocabulary)).perplexity(held_out)
    unigram_probs = np.bincount(train, minlength=len(vocabulary)) / train.size
    unigram = math.exp(-np.log(unigram_probs[held_out[1:]]).mean())
    assert bigram < 0.5 * unigram
    assert 1.0 < bigram < 4.0  # the text is nearly deterministic given the previous word


def test_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError):
        KneserNeyBigram.fit(np.array([0, 1, 7]), vocab_size=5)
