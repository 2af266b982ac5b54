"""Each dialect's request body maps itself to SamplingParams; completions and chat share one mapping.
Unit tests: no model, no app."""

from __future__ import annotations

from types import SimpleNamespace

from quill.server.api.openai.chat_schemas import ChatCompletionRequest
from quill.server.api.openai.completion_schemas import CompletionRequest
from quill.server.api.tgi.schemas import GenerateParameters

HOSTED = SimpleNamespace(loaded=SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=50)),
                                               generation_defaults={}))
MESSAGES = [{"role": "user", "content": "hi"}]
SHARED = dict(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.1, presence_penalty=0.5,
              frequency_penalty=-0.5, logit_bias={"3": 1.0}, seed=7, stop="x", stop_token_ids=[4], ignore_eos=True,
              min_tokens=2, skip_special_tokens=False)


def test_completions_and_chat_map_the_settings_they_share_alike():
    completion = CompletionRequest(prompt="p", n=2, logprobs=3, **SHARED).to_sampling_params(HOSTED, 10)
    chat = ChatCompletionRequest(messages=MESSAGES, n=2, logprobs=True, top_logprobs=3,
                                 **SHARED).to_sampling_params(HOSTED, 10)
    assert completion == chat
    assert completion.logit_bias == {3: 1.0} and completion.stop == ["x"] and completion.max_tokens == 10
    assert (completion.n, completion.logprobs, completion.prompt_logprobs) == (2, 3, None)


def test_each_openai_route_says_how_many_sequences_and_beams():
    sampled = CompletionRequest(prompt="p", n=2, best_of=3, echo=True, logprobs=1).to_sampling_params(HOSTED, 4)
    assert (sampled.n, sampled.beam_width, sampled.prompt_logprobs) == (3, 1, 1)
    beams = CompletionRequest(prompt="p", n=2, best_of=4, use_beam_search=True).to_sampling_params(HOSTED, 4)
    assert (beams.n, beams.beam_width, beams.use_beam_search) == (2, 4, True)
    chat_beams = ChatCompletionRequest(messages=MESSAGES, n=3, use_beam_search=True).to_sampling_params(HOSTED, 4)
    assert (chat_beams.n, chat_beams.beam_width) == (3, 3)
    assert ChatCompletionRequest(messages=MESSAGES).to_sampling_params(HOSTED, 4).logprobs is None


def test_tgi_parameters_stay_greedy_unless_a_sampling_setting_is_given():
    greedy = GenerateParameters()
    assert not greedy.is_sampling and greedy.to_sampling_params(HOSTED, 5, None, stream=False).is_greedy
    sampled = GenerateParameters(top_k=3, best_of=2, details=True, top_n_tokens=2)
    params = sampled.to_sampling_params(HOSTED, 5, 11, stream=False)
    assert sampled.is_sampling and params.temperature == 1.0 and params.top_k == 3
    assert (params.n, params.seed, params.logprobs, params.prompt_logprobs) == (2, 11, 2, None)
    streamed = GenerateParameters().to_sampling_params(HOSTED, 5, None, stream=True)  # each token carries its logprob
    assert (streamed.logprobs, streamed.prompt_logprobs) == (0, None)
    prefill = GenerateParameters(decoder_input_details=True).to_sampling_params(HOSTED, 5, None, stream=False)
    assert (prefill.logprobs, prefill.prompt_logprobs) == (0, 0)
    beams = GenerateParameters(num_beams=3, length_penalty=0.5).to_sampling_params(HOSTED, 5, None, stream=False)
    assert (beams.use_beam_search, beams.beam_width, beams.n, beams.length_penalty) == (True, 3, 1, 0.5)
