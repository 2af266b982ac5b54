import dataclasses
import math

import pytest

from quill.server.sampling.params import SamplingParamError, SamplingParams
from quill.server.structured.constraint import StructuredOutput

NAN, INF = math.nan, math.inf

INVALID = [
    ("n", 0),
    ("n", -1),
    ("n", 1.5),
    ("n", True),
    ("max_tokens", 0),
    ("max_tokens", None),
    ("min_tokens", -1),
    ("min_tokens", 17),  # > max_tokens (16)
    ("temperature", -0.1),
    ("temperature", NAN),
    ("temperature", INF),
    ("temperature", "hot"),
    ("top_k", -2),
    ("top_k", 2.0),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_p", -0.1),
    ("top_p", NAN),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("min_p", INF),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", NAN),
    ("repetition_penalty", INF),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("presence_penalty", NAN),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", INF),
    ("logit_bias", {5: 101.0}),
    ("logit_bias", {5: -100.5}),
    ("logit_bias", {5: NAN}),
    ("logit_bias", {5: INF}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"5": 1.0}),
    ("logit_bias", [1, 2]),
    ("seed", 1.5),
    ("seed", 2**64),
    ("stop", [""]),
    ("stop", ""),
    ("stop", ["ok", 3]),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1.0]),
    ("ignore_eos", 1),
    ("skip_special_tokens", "no"),
    ("skip_special_tokens", None),
    ("logprobs", 21),
    ("logprobs", -1),
    ("logprobs", 2.0),
    ("prompt_logprobs", 21),
    ("prompt_logprobs", -1),
    ("beam_width", 0),
    ("beam_width", 2),  # without use_beam_search
    ("length_penalty", 0.5),  # without use_beam_search
    ("length_penalty_type", "wu"),  # without use_beam_search
    ("length_penalty_type", "avg"),
    ("early_stopping", True),  # without use_beam_search
    ("early_stopping", "always"),
    ("use_beam_search", "yes"),
]


@pytest.mark.parametrize("name, value", INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_setting_is_rejected_naming_the_parameter(name, value):
    with pytest.raises(SamplingParamError) as error:
        SamplingParams(**{name: value})
    assert error.value.param == name
    assert str(error.value).startswith(name)
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(top_k=-1),
        dict(top_k=0),
        dict(top_k=1),
        dict(top_k=10**6),
        dict(top_p=1.0),
        dict(top_p=1e-9),
        dict(min_p=0.0),
        dict(min_p=1.0),
        dict(temperature=0.0),
        dict(temperature=0, n=4),  # n identical greedy completions, as vLLM allows
        dict(repetition_penalty=1e-3),
        dict(presence_penalty=-2.0, frequency_penalty=2.0),
        dict(logit_bias={0: -100.0, 7: 100, 9: 0.5}),
        dict(seed=0),
        dict(seed=-(2**63)),
        dict(seed=2**64 - 1),
        dict(logprobs=0, prompt_logprobs=20),
        dict(skip_special_tokens=False),
        dict(min_tokens=16, max_tokens=16),
        dict(use_beam_search=True, beam_width=4, n=4, length_penalty=0.6, early_stopping="never"),
        dict(use_beam_search=True, early_stopping=True),
    ],
)
def test_valid_settings_are_accepted(kwargs):
    SamplingParams(**kwargs)


def test_beam_width_must_cover_n_with_beam_search():
    with pytest.raises(SamplingParamError) as error:
        SamplingParams(use_beam_search=True, n=3, beam_width=2)
    assert error.value.param == "beam_width"


def test_stop_is_normalized_to_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []


def test_replace_checks_again():
    params = SamplingParams(temperature=0.7)
    with pytest.raises(SamplingParamError):
        dataclasses.replace(params, temperature=-1.0)


def test_is_greedy_below_the_epsilon():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=1e-7).is_greedy
    assert not SamplingParams(temperature=0.01).is_greedy
    assert not SamplingParams().is_greedy


def test_has_penalties():
    assert not SamplingParams().has_penalties
    assert SamplingParams(repetition_penalty=1.1).has_penalties
    assert SamplingParams(frequency_penalty=-0.5).has_penalties


def test_all_stop_token_ids_includes_eos_unless_ignored():
    assert SamplingParams(stop_token_ids=[5]).all_stop_token_ids([0, 1]) == {0, 1, 5}
    assert SamplingParams(stop_token_ids=[5], ignore_eos=True).all_stop_token_ids([0, 1]) == {5}


def test_check_vocab_names_the_out_of_range_ids():
    SamplingParams(logit_bias={99: 1.0}, stop_token_ids=[99]).check_vocab(100)
    with pytest.raises(SamplingParamError) as error:
        SamplingParams(logit_bias={100: 1.0}).check_vocab(100)
    assert error.value.param == "logit_bias"
    with pytest.raises(SamplingParamError) as error:
        SamplingParams(stop_token_ids=[3, 250]).check_vocab(100)
    assert error.value.param == "stop_token_ids"


def test_special_tokens_are_skipped_by_default_as_in_vllm():
    assert SamplingParams().skip_special_tokens is True
    assert SamplingParams(skip_special_tokens=False).skip_special_tokens is False


def test_only_plain_greedy_needs_no_more_than_the_argmax():
    assert SamplingParams(temperature=0).needs_only_argmax(0)
    assert SamplingParams(temperature=0, min_tokens=2, max_tokens=4).needs_only_argmax(2)  # its ban has lifted
    assert SamplingParams(temperature=0, logit_bias={}).needs_only_argmax(0)
    for reads_more in (dict(temperature=0.5), dict(logprobs=0), dict(prompt_logprobs=0), dict(repetition_penalty=1.1),
                       dict(presence_penalty=0.1), dict(frequency_penalty=-0.1), dict(logit_bias={3: 1.0}),
                       dict(min_tokens=2, max_tokens=4), dict(n=2), dict(use_beam_search=True),
                       dict(structured=StructuredOutput("json_object"))):
        assert not SamplingParams(**{"temperature": 0, **reads_more}).needs_only_argmax(1), reads_more


def test_only_logprobs_or_several_samples_score_the_sampled_tokens():
    """What decides whether cumulative_logprob is a sum of scores or 0.0, whatever else shares the steps."""
    assert SamplingParams(logprobs=0).scores_samples and SamplingParams(n=2, temperature=0.8).scores_samples
    for plain in (dict(), dict(temperature=0), dict(prompt_logprobs=2), dict(seed=3), dict(repetition_penalty=1.2)):
        assert not SamplingParams(**plain).scores_samples, plain
