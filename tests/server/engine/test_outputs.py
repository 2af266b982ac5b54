"""The one function that joins a request's output deltas."""

from __future__ import annotations

import copy

from quill.server.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob, merge_outputs


def steps() -> list[RequestOutput]:
    return [
        RequestOutput("r", [CompletionOutput(0, "To", [1], [TokenLogprob(1, -1.0, [(1, -1.0)])], None, -1.0)], False, 4,
                      prompt_logprobs=[None, TokenLogprob(9, -3.0)], queue_time=0.5),
        RequestOutput("r", [CompletionOutput(0, " be", [2, 3], [TokenLogprob(2, -2.0), TokenLogprob(3, -0.1)], None,
                                             -3.1)], False, 4),
        RequestOutput("r", [CompletionOutput(0, "", [], [], "length", -3.1),
                            CompletionOutput(1, "!", [4], None, "stop", -0.5, score=-0.25)], True, 4, error="late"),
    ]


def test_merged_steps_cover_every_token_in_order():
    merged = merge_outputs(steps())
    assert merged.finished and merged.num_prompt_tokens == 4
    first, second = merged.outputs
    assert (first.text, first.token_ids, first.finish_reason, first.cumulative_logprob) == ("To be", [1, 2, 3],
                                                                                            "length", -3.1)
    assert [e.token_id for e in first.logprobs] == [1, 2, 3] and first.logprobs[0].top == [(1, -1.0)]
    assert (second.index, second.text, second.token_ids, second.logprobs, second.score) == (1, "!", [4], None, -0.25)


def test_what_only_a_first_or_last_output_carries_is_kept():
    merged = merge_outputs(steps())
    assert merged.prompt_logprobs == [None, TokenLogprob(9, -3.0)]
    assert (merged.queue_time, merged.error) == (0.5, "late")


def test_merging_in_any_grouping_gives_the_same_output():
    """A stream joins whatever waited when it was read; a whole answer joins those joins again."""
    whole = merge_outputs(steps())
    s = steps()
    assert merge_outputs([merge_outputs(s[:2]), s[2]]) == whole
    assert merge_outputs([s[0], merge_outputs(s[1:])]) == whole


def test_the_outputs_merged_are_left_as_they_were():
    s = steps()
    before = copy.deepcopy(s)
    merge_outputs(s)
    assert s == before
    assert merge_outputs(s[:1]) is s[0]
