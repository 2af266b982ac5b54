"""The adaptive softmax: a full distribution, and a greedy pick that skips clusters but never the argmax."""

from __future__ import annotations

import pytest
import torch

from quill.models.families.adaptive_softmax import AdaptiveSoftmax


def layer(seed: int = 0, scale: float = 1.0) -> AdaptiveSoftmax:
    torch.manual_seed(seed)
    softmax = AdaptiveSoftmax(32, [50, 120, 400, 1000], [16, 8, 2]).eval()
    with torch.no_grad():
        for p in softmax.parameters():
            p.normal_(std=scale / p.shape[-1] ** 0.5)
    return softmax


def test_the_full_distribution_sums_to_one_with_and_without_autograd():
    softmax, h = layer(), torch.randn(64, 32) * 3
    log_probs = softmax.log_probs(h)
    assert log_probs.shape == (64, 1000) and log_probs.requires_grad
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(64), atol=1e-5, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(softmax.log_probs(h), log_probs, atol=0, rtol=0)


@pytest.mark.parametrize("scale", [0.5, 4.0, 30.0])  # flat to peaked: at 30 tails often hold the best word
def test_greedy_gives_the_full_distributions_argmax(scale):
    softmax = layer(seed=int(scale), scale=scale)
    h = torch.randn(256, 32)
    full = softmax.log_probs(h)
    ids, values = softmax.greedy(h)
    assert ids.tolist() == full.argmax(-1).tolist()
    torch.testing.assert_close(values, full.max(-1).values, atol=1e-6, rtol=0)


def test_greedy_scores_only_the_clusters_that_could_win():
    softmax = layer(scale=4.0)
    rows_scored = []
    for tail in softmax.tail:
        tail.register_forward_hook(lambda module, args, out: rows_scored.append(args[0].shape[0]))
    h = torch.randn(256, 32)
    softmax.greedy(h)
    assert sum(rows_scored) < 3 * 256 // 2  # the full distribution scores all 3 x 256
    winners = softmax.log_probs(h).argmax(-1)
    assert (winners >= 50).any()  # some rows did need a tail
