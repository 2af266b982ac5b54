"""One top-k for every beam request of a step equals ranking each request on its own."""

from __future__ import annotations

import torch

from quill.server.sampling.beam import BeamRequest, beam_candidates
from tests.conftest import TEST_DEVICE


def test_batched_candidates_equal_per_request_ranking():
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(7, vocab).to(TEST_DEVICE)
    requests = [
        BeamRequest(rows=[0], scores=[0.0], num_candidates=4),  # a prompt that just completed
        BeamRequest(rows=[1, 2, 3], scores=[-1.0, -1.5, -2.5], num_candidates=6, banned=(0,)),
        BeamRequest(rows=[5, 4], scores=[-0.5, -0.7], num_candidates=8),  # rows need not be in order
    ]
    values, indices = beam_candidates(logits, requests)
    for g, r in enumerate(requests):
        total = torch.log_softmax(logits[r.rows], dim=-1) + torch.tensor(r.scores, device=TEST_DEVICE)[:, None]
        total[:, list(r.banned)] = float("-inf")
        expected_values, expected_indices = total.flatten().topk(r.num_candidates)
        assert torch.allclose(values[g, : r.num_candidates], expected_values)
        assert indices[g, : r.num_candidates].tolist() == expected_indices.tolist()
        assert (indices[g, : r.num_candidates] % vocab != 0).all() or not r.banned


def test_padding_beams_are_never_chosen():
    logits = torch.zeros(3, 4, device=TEST_DEVICE)  # every candidate ties
    values, indices = beam_candidates(logits, [BeamRequest([0], [0.0], 4), BeamRequest([1, 2], [0.0, 0.0], 8)])
    assert (indices[0, :4] < 4).all()  # only the one real beam of the first request
    assert torch.isfinite(values[0, :4]).all()
