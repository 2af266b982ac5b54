"""The coverage penalties' arithmetic (quill/server/sampling/coverage.py) on hand-worked values, and beam search
taking each beam's penalty off the hypotheses it ends."""

from __future__ import annotations

import math

import pytest
import torch

from quill.server.engine.beam_search import BeamSearch
from quill.server.sampling.coverage import coverage_penalty


def test_wu_penalises_what_is_covered_less_than_once():
    coverage = torch.tensor([[0.5, 1.0, 2.0], [0.25, 0.5, 1.5]])
    expected = [-0.2 * math.log(0.5), -0.2 * (math.log(0.25) + math.log(0.5))]
    assert coverage_penalty(coverage, 0.2, "wu").tolist() == pytest.approx(expected)


def test_summary_penalises_what_is_covered_more_than_once():
    coverage = torch.tensor([[0.5, 1.0, 2.0], [0.25, 3.5, 1.5]])
    assert coverage_penalty(coverage, 0.2, "summary").tolist() == pytest.approx([0.2 * 1.0, 0.2 * 3.0])


def test_a_source_token_never_attended_to_gives_a_finite_penalty():
    penalty = coverage_penalty(torch.tensor([[0.0, 1.0]]), 1.0, "wu")
    assert torch.isfinite(penalty).all() and penalty.item() > 80  # -log of float32's smallest normal: 87.3


def test_beam_search_takes_each_parents_penalty_off_the_hypotheses_it_ends():
    """Two beams end at the same step: without penalties the likelier one ranks first; its parent's coverage
    penalty of 2 puts it second."""
    eos = 9
    for penalties, first in ((None, [5, eos]), ([0.0, 2.0], [4, eos])):
        search = BeamSearch(width=2, max_tokens=6, eos_token_ids=[eos])
        search.scores = [-0.5, -0.4]
        # candidates, best first, as parent * V + token (V = 10): beam 1 ends, beam 0 ends, both go on
        search.advance([-1.0, -1.5, -2.0, -2.5], [10 + eos, eos, 10 + 6, 7], 10, [[4], [5]], penalties)
        assert [h.token_ids for h in search.finished][0] == first
        lost = penalties or [0.0, 0.0]
        assert sorted(h.score for h in search.finished) == pytest.approx(sorted([-1.0 / 2 - lost[1],
                                                                                 -1.5 / 2 - lost[0]]))


def test_a_penalty_that_never_falls_settles_the_search_as_soon_as_no_beam_can_win():
    """One hypothesis kept (score -0.5 - 1.0); the running beam would score -0.55 unpenalised, but has already
    earned a penalty of 1.0 that "summary" can only raise: settled. Under "wu" (the penalty may fall) it goes on."""
    eos = 9
    for never_falls, settled in ((True, True), (False, False)):
        search = BeamSearch(width=1, max_tokens=6, eos_token_ids=[eos], penalty_never_falls=never_falls)
        step = search.advance([-0.5, -0.55], [eos, 4], 10, [[]], [1.0])
        assert [h.token_ids for h in search.finished] == [[eos]]
        assert search.finished[0].score == pytest.approx(-1.5)
        assert step.done is settled


def test_stepwise_penalties_rank_the_candidates_and_come_off_before_normalising():
    """The runner ranked the candidates with each parent's penalty taken off (parent 1's 2.0 puts its continuations
    last); the beams carry plain sums again, and a hypothesis scores (sum - penalty) / length."""
    eos = 9
    search = BeamSearch(width=2, max_tokens=6, eos_token_ids=[eos], stepwise=True)
    search.scores = [-0.5, -0.4]
    # plain sums: beam 0 ends -1.5, beam 0 goes on -2.0; beam 1's -1.0 and -1.2 shown less its penalty of 2.0
    step = search.advance([-1.5, -2.0, -3.0, -3.2], [eos, 6, 10 + eos, 10 + 7], 10, [[4], [5]], [0.0, 2.0])
    assert [h.token_ids for h in search.finished][0] == [4, eos]
    assert search.finished[0].score == pytest.approx(-1.5 / 2) and search.finished[0].sum_logprob == -1.5
    assert step.running[0] == (0, 6, -2.0) and step.running[1] == (1, 7, pytest.approx(-1.2))
