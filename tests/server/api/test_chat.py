"""/v1/chat/completions in process: the prompt is the template's (as transformers builds it), greedy
replies equal transformers' generate() with the checkpoint's EOS list, the chat shapes (plain and
streamed, logprobs, n, usage), the bundled models chat out of the box, and every bad request is a
400 in OpenAI's shape before any byte, streamed or not."""

from __future__ import annotations

import json

import httpx
import pytest
import transformers

from quill.models.text.chat_template import ChatTemplate
from quill.server.api.app import create_app
from quill.server.config import ServerConfig
from quill.server.hosting import ModelHost
from tests.hub_checkpoints import reference_chat

LLAMA = "quill-test/tiny-llama-chat"
CHATS = {
    "one turn": [{"role": "user", "content": "To be, or not to be"}],
    "system": [{"role": "system", "content": "Speak."}, {"role": "user", "content": "To be, or not to be"}],
    "system and history": [
        {"role": "system", "content": "Speak."},
        {"role": "user", "content": "Who is there?"},
        {"role": "assistant", "content": "Nay, answer me."},
        {"role": "user", "content": [{"type": "text", "text": "Long live"}, {"type": "text", "text": "the king!"}]},
    ],
}
MAX_TOKENS = 12
FINISH = {"one turn": "stop", "system": "length"}  # of greedy decoding, MAX_TOKENS at most


@pytest.fixture(scope="module")
def app(hub_cache, tiny_checkpoints):
    """llama: a hub checkpoint with a chat template and generation defaults; tiny: no template;
    shakespeare: a bundled model, with the template it ships."""
    config = ServerConfig(
        models=[f"llama={hub_cache[1][LLAMA].path}", f"tiny={tiny_checkpoints['tiny-transformer']}",
                "shakespeare=shakespeare-transformer"],
        device="cpu", dtype="float32", cache_bytes=4 * 2**20, block_size=4, max_tokens_limit=256,
    )
    host = ModelHost.load(config)
    host.start()
    yield create_app(host, config)
    host.shutdown()


@pytest.fixture
async def client(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test",
                                 timeout=30) as c:
        yield c


async def chat(client, **body) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"model": "llama", **body})


def sse_events(text: str) -> list:
    events = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@pytest.mark.parametrize("conversation", list(FINISH))
async def test_greedy_reply_equals_transformers_generate_on_the_template_ids(client, hub_cache, conversation):
    expected = reference_chat(hub_cache[1][LLAMA], CHATS[conversation], MAX_TOKENS)
    assert expected.finish_reason == FINISH[conversation]  # one chat ends on a generation_config EOS id, one at length
    r = await chat(client, messages=CHATS[conversation], max_tokens=MAX_TOKENS, temperature=0,
                   logprobs=True, top_logprobs=2)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "llama" and body["id"].startswith("chatcmpl-")
    assert body["usage"] == {"prompt_tokens": len(expected.prompt_ids), "completion_tokens": len(expected.output_ids),
                             "total_tokens": len(expected.prompt_ids) + len(expected.output_ids)}
    (choice,) = body["choices"]
    assert choice["finish_reason"] == expected.finish_reason
    content = choice["logprobs"]["content"]  # the same tokens: each with transformers' log-probability
    assert len(content) == len(expected.output_ids)
    for entry, logprob in zip(content, expected.logprobs):
        assert entry["logprob"] == pytest.approx(logprob, abs=1e-4)
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the chosen token is the likeliest
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
    # The text is what /v1/completions makes of the same ids (one detokenization contract for both routes);
    # cut by length, that is transformers' decode of them.
    completion = (await client.post("/v1/completions", json={
        "model": "llama", "prompt": expected.prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0})).json()
    assert choice["message"] == {"role": "assistant", "content": completion["choices"][0]["text"]}
    if expected.finish_reason == "length":
        assert choice["message"]["content"] == expected.text


async def test_prompt_ids_equal_apply_chat_template(client, hub_cache):
    auto = transformers.AutoTokenizer.from_pretrained(hub_cache[1][LLAMA].path)
    for messages in CHATS.values():
        # This template reads content as a string: text parts arrive joined by newlines (vLLM's rule).
        as_strings = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                       "\n".join(part["text"] for part in m["content"])} for m in messages]
        expected = auto.apply_chat_template(as_strings, add_generation_prompt=True, tokenize=True, return_dict=False)
        r = await client.post("/tokenize", json={"model": "llama", "messages": messages})
        assert r.json()["tokens"] == list(expected)
    continued = CHATS["system and history"][:3]
    expected = auto.apply_chat_template(continued, continue_final_message=True, tokenize=True, return_dict=False)
    r = await client.post("/tokenize", json={"model": "llama", "messages": continued, "continue_final_message": True})
    assert r.json()["tokens"] == list(expected)
    r = await chat(client, messages=continued, continue_final_message=True, max_tokens=1)
    assert r.json()["usage"]["prompt_tokens"] == len(expected)


async def test_streamed_reply_is_the_plain_reply_in_deltas_with_the_role_first(client):
    messages = CHATS["one turn"]
    plain = (await chat(client, messages=messages, max_tokens=MAX_TOKENS, temperature=0, n=2, logprobs=True)).json()
    r = await chat(client, messages=messages, max_tokens=MAX_TOKENS, temperature=0, n=2, logprobs=True, stream=True,
                   stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    for index, choice in enumerate(plain["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert all("role" not in c["delta"] for c in mine[1:])
        assert "".join(c["delta"]["content"] for c in mine) == choice["message"]["content"]
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + [choice["finish_reason"]]
        streamed = [e for c in mine[1:] for e in c["logprobs"]["content"]]
        assert streamed == choice["logprobs"]["content"]


async def test_sampling_settings_n_seed_stop_and_max_completion_tokens(client):
    messages = CHATS["one turn"]
    sampled = await chat(client, messages=messages, max_tokens=8, n=3, seed=5, temperature=1.0, ignore_eos=True)
    again = await chat(client, messages=messages, max_tokens=8, n=3, seed=5, temperature=1.0, ignore_eos=True)
    assert [c["index"] for c in sampled.json()["choices"]] == [0, 1, 2]
    assert sampled.json()["choices"] == again.json()["choices"]
    capped = await chat(client, messages=messages, max_tokens=10, max_completion_tokens=3, ignore_eos=True)
    assert capped.json()["usage"]["completion_tokens"] == 3 and capped.json()["choices"][0]["finish_reason"] == "length"
    whole = (await chat(client, messages=messages, max_tokens=8, temperature=0, ignore_eos=True)).json()
    text = whole["choices"][0]["message"]["content"]
    stop = text[3:5]
    stopped = (await chat(client, messages=messages, max_tokens=8, temperature=0, ignore_eos=True, stop=stop)).json()
    assert stopped["choices"][0] == {**whole["choices"][0], "message": {"role": "assistant",
                                                                         "content": text[: text.index(stop)]},
                                     "finish_reason": "stop"}
    beams = (await chat(client, messages=messages, max_tokens=4, n=2, use_beam_search=True)).json()
    assert [c["index"] for c in beams["choices"]] == [0, 1]


async def test_placeholder_model_names_mean_the_default_model(client):
    for name in ("tgi", "dummy"):
        r = await chat(client, model=name, messages=CHATS["one turn"], max_tokens=2)
        assert r.status_code == 200 and r.json()["model"] == "llama"
    r = await chat(client, model="nope", messages=CHATS["one turn"], max_tokens=2)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_bundled_model_chats_out_of_the_box(client, app):
    hosted = app.state.host.models["shakespeare"]
    messages = [{"role": "system", "content": "Enter HAMLET."}, {"role": "user", "content": "What dost thou read?"}]
    r = await chat(client, model="shakespeare", messages=messages, max_tokens=8, temperature=0, ignore_eos=True)
    assert r.status_code == 200, r.text
    prompt = "[Enter HAMLET.]\n\nUSER.\nWhat dost thou read?\n\nQUILL.\n"  # the scene the template writes
    assert r.json()["usage"]["prompt_tokens"] == len(hosted.tokenizer.encode(prompt, add_special_tokens=False))
    assert r.json()["usage"]["completion_tokens"] == 8 and r.json()["choices"][0]["message"]["content"]
    named = await client.post("/tokenize", json={"model": "shakespeare", "messages": [
        {"role": "user", "name": "Horatio", "content": "Hail"}], "chat_template_kwargs": {"assistant_name": "Hamlet"}})
    assert named.json()["tokens"] == hosted.tokenizer.encode("HORATIO.\nHail\n\nHAMLET.\n")


async def test_models_say_which_chat(client, hub_cache):
    listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert {name: m["chat"] for name, m in listed.items()} == {"llama": True, "tiny": False, "shakespeare": True}
    assert listed["llama"]["root"] == str(hub_cache[1][LLAMA].path) and listed["llama"]["max_model_len"] == 128
    assert listed["shakespeare"]["root"] == "shakespeare-transformer"


BAD_REQUESTS = [
    (dict(messages=[]), "messages", "at least one message"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages.0.role", "must be one of"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]),
     "messages.0.content.0.type", "only text parts"),
    (dict(messages=[{"role": "user"}]), "messages.0.content", "needs text"),
    (dict(messages=[{"role": "user", "content": 7}]), "messages.0.content", None),
    (dict(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True, continue_final_message=True),
     "continue_final_message", "cannot both be true"),
    (dict(messages=[{"role": "user", "content": "hi"}], chat_template_kwargs={"messages": []}),
     "chat_template_kwargs", "comes from the request"),
    (dict(model="shakespeare", messages=[{"role": "user", "content": "hi"}],
          tools=[{"type": "function", "function": {"name": "f"}}]), "tools", "does not support tools"),
    (dict(messages=[{"role": "user", "content": "hi"}],
          response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}),
     "response_format", "if"),
    (dict(messages=[{"role": "user", "content": "hi"}], top_logprobs=2), "top_logprobs", "needs logprobs"),
    (dict(messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=21), "top_logprobs", None),
    (dict(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=0), "max_completion_tokens", None),
    (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=200), "max_tokens", "maximum context length"),
    (dict(messages=[{"role": "user", "content": "hi"}], temperature=-1), "temperature", None),
    (dict(messages=[{"role": "user", "content": "hi"}], use_beam_search=True, logprobs=True), "logprobs", None),
    (dict(model="tiny", messages=[{"role": "user", "content": "hi"}]), "model", "has no chat template"),
    (dict(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function",
                                                                              "function": {"name": "f"}}]),
     "model", "has no chat template"),
    (dict(messages=[{"role": "user", "content": "hi"}], max_tokns=5), "max_tokns", "Unrecognized request argument"),
    (dict(messages=[{"role": "user", "content": "hi", "nmae": "Horatio"}]), "messages.0.nmae", "Unrecognized"),
    (dict(messages=[{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}]),
     "messages.0.content.0.cache_control", "Unrecognized request argument supplied"),
    (dict(messages=[{"role": "user", "content": "hi"}], functions=[{"name": "f"}]), "functions", "Unrecognized"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("body, param, words", BAD_REQUESTS, ids=[p for _, p, _ in BAD_REQUESTS])
async def test_bad_requests_get_400_in_openai_shape_before_any_byte(client, body, param, words, stream):
    r = await chat(client, **body, stream=stream)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param or (words is None and error["param"].startswith(param))  # schema: + union member
    if words:
        assert words in error["message"]


# What clients send that changes nothing generated: who asks, how to bill, store or cache, tool-call shaping.
ACCEPTED_AND_IGNORED = dict(
    user="u-1", safety_identifier="s-1", metadata={"team": "stage"}, store=False, service_tier="auto",
    prompt_cache_key="hamlet", prompt_cache_retention="24h", prompt_cache_options={"mode": "implicit"},
    parallel_tool_calls=False, tool_prompt="Tools:", tool_choice="none", response_format={"type": "text"},
)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_fields_that_change_nothing_generated_are_accepted_and_ignored(client, stream):
    messages = CHATS["system and history"]
    # An answer's message sent back whole, as a client that keeps the conversation may.
    whole = [*messages[:2], {**messages[2], "refusal": None, "annotations": [], "audio": None,
                             "function_call": None, "tool_calls": None}, messages[3]]
    plain = await chat(client, messages=messages, max_tokens=6, temperature=0, stream=stream)
    ignored = await chat(client, messages=whole, max_tokens=6, temperature=0, stream=stream,
                         stream_options={"include_usage": True, "include_obfuscation": False} if stream else None,
                         **ACCEPTED_AND_IGNORED)
    assert ignored.status_code == 200, ignored.text
    if stream:
        def text(r):
            return "".join(e["choices"][0]["delta"]["content"] for e in sse_events(r.text)[:-1] if e["choices"])
        assert text(ignored) == text(plain)
    else:
        assert ignored.json()["choices"] == plain.json()["choices"] and ignored.json()["usage"] == plain.json()["usage"]


async def test_a_template_that_refuses_the_messages_is_a_400_with_its_words(app, client):
    hosted = app.state.host.models["llama"]
    original = hosted.chat_template
    hosted.chat_template = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must "
                                        "start with a user message') }}{% endif %}{{ messages[0].content }}")
    try:
        r = await chat(client, messages=[{"role": "assistant", "content": "hi"}])
    finally:
        hosted.chat_template = original
    assert r.status_code == 400 and "Conversations must start with a user message" in r.json()["error"]["message"]
