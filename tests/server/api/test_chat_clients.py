"""Real chat clients against a real `quill serve` hosting a tiny hub checkpoint by id, offline: the
official openai client (plain, streamed, with logprobs) and huggingface_hub's InferenceClient
(chat_completion plain and streamed, get_endpoint_info), which sends the placeholder model
"dummy" and reads TGI's Messages API. Greedy replies are transformers' on the template's ids. Every
argument either client takes that Quill supports is accepted; an unknown one is named back.
Nothing leaves 127.0.0.1."""

from __future__ import annotations

import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.conftest import TEST_DEVICE, LiveServer
from tests.hub_checkpoints import COMMIT, reference_chat

LLAMA = "quill-test/tiny-llama-chat"
MESSAGES = [{"role": "system", "content": "Speak."}, {"role": "user", "content": "To be, or not to be"}]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(hub_cache):
    cache, _ = hub_cache
    with LiveServer({}, "--model", LLAMA, env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}) as live:
        yield live


@pytest.fixture(scope="module")
def expected(hub_cache):
    reference = reference_chat(hub_cache[1][LLAMA], MESSAGES, MAX_TOKENS)
    assert reference.finish_reason == "length"  # so its text is transformers' decode of the ids, in full
    return reference


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hf(server) -> InferenceClient:
    return InferenceClient(base_url=server.url, api_key="unused", timeout=30)


def test_openai_chat_with_logprobs(oai, expected):
    done = oai.chat.completions.create(model=LLAMA, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                       logprobs=True, top_logprobs=3)
    (choice,) = done.choices
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == "length" and done.model == LLAMA and done.object == "chat.completion"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(expected.prompt_ids), MAX_TOKENS)
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(expected.logprobs, abs=1e-4)
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in choice.logprobs.content)


def test_openai_chat_streamed(oai, expected):
    chunks = list(oai.chat.completions.create(model=LLAMA, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                              stream=True, stream_options={"include_usage": True}, logprobs=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.delta.content or "" for c in content) == expected.text
    assert [c.finish_reason for c in content][-1] == "length"
    streamed = [t.logprob for c in content if c.logprobs for t in c.logprobs.content]
    assert streamed == pytest.approx(expected.logprobs, abs=1e-4)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_openai_client_sees_bad_messages_before_the_stream(oai):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="role"):
            oai.chat.completions.create(model=LLAMA, messages=[{"role": "wizard", "content": "hi"}], stream=stream)


def test_openai_chat_with_every_argument_quill_takes(oai):
    """Each argument of chat.completions.create off its default but those needing what Quill lacks (tools,
    audio, functions, ...), none in extra_body: the bookkeeping ones are accepted and ignored."""
    options = dict(model=LLAMA, messages=MESSAGES, max_tokens=10, max_completion_tokens=4, temperature=0.8,
                   top_p=0.9, n=2, seed=3, stop=["\n\n"], presence_penalty=0.5, frequency_penalty=0.5,
                   logit_bias={"5": -1}, logprobs=True, top_logprobs=2, response_format={"type": "text"},
                   tool_choice="none", parallel_tool_calls=False, user="u-1", safety_identifier="s-1",
                   metadata={"team": "stage"}, store=False, service_tier="auto", prompt_cache_key="hamlet",
                   prompt_cache_retention="24h", prompt_cache_options={"mode": "implicit"})
    done = oai.chat.completions.create(**options)
    assert len(done.choices) == 2 and done.usage.completion_tokens <= 8
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True,
                                                                           "include_obfuscation": False}, **options))
    assert chunks[-1].usage.completion_tokens <= 8 and {c.choices[0].index for c in chunks if c.choices} == {0, 1}


def test_openai_client_hears_which_argument_is_unknown(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=LLAMA, messages=MESSAGES, extra_body={"max_tokns": 5})
    assert info.value.param == "max_tokns" and "Unrecognized request argument" in info.value.message


def test_inference_client_chat_completion_with_every_argument_quill_takes(hf):
    """Each argument of chat_completion off its default but tools, response_format (test_structured_outputs.py) and
    logit_bias (TGI's list form, which Quill does not read)."""
    options = dict(max_tokens=4, temperature=0.8, top_p=0.9, n=2, seed=3, stop=["\n\n"], presence_penalty=0.5,
                   frequency_penalty=0.5, logprobs=True, top_logprobs=2, tool_choice="none", tool_prompt="Tools:")
    done = hf.chat_completion(MESSAGES, **options)
    assert len(done.choices) == 2 and done.usage.completion_tokens <= 8
    chunks = list(hf.chat_completion(MESSAGES, stream=True, stream_options={"include_usage": True}, **options))
    assert chunks[-1].usage.completion_tokens <= 8 and {c.choices[0].index for c in chunks if c.choices} == {0, 1}


def test_inference_client_hears_which_argument_is_unknown(hf):
    with pytest.raises(HfHubHTTPError) as info:
        hf.chat_completion(MESSAGES, extra_body={"max_tokns": 5})
    assert info.value.response.status_code == 400
    assert info.value.response.json()["error"]["message"] == "Unrecognized request argument supplied: max_tokns"


def test_inference_client_chat_completion(hf, expected):
    done = hf.chat_completion(MESSAGES, max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=2)
    (choice,) = done.choices
    assert choice.message.content == expected.text and choice.finish_reason == "length"
    assert done.usage.completion_tokens == MAX_TOKENS and done.system_fingerprint.startswith("quill-")
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(expected.logprobs, abs=1e-4)
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)


def test_inference_client_chat_completion_streamed(hf, expected):
    chunks = list(hf.chat_completion(MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_inference_client_sees_bad_messages(hf):
    with pytest.raises(HfHubHTTPError) as info:
        hf.chat_completion([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert info.value.response.status_code == 400 and "only text parts" in info.value.response.text


def test_get_endpoint_info(server):
    # This huggingface_hub asks for the provider by name before it reads an endpoint's /info.
    info = InferenceClient(server.url, provider="hf-inference").get_endpoint_info()
    assert info["model_id"] == LLAMA and info["model_sha"] == COMMIT
    assert info["max_total_tokens"] == 128 and info["max_input_tokens"] == 127
    assert info["model_device_type"] == TEST_DEVICE.type and info["version"]
