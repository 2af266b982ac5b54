"""Tools on /v1/chat/completions in process, read by the real openai client: scripted answers in each
family's call format, cut at every point and streamed, assemble into the calls of the plain answer, with
no markup in the content and finish_reason "tool_calls"; the prompt with tools and a history of calls is
transformers'; every bad tools or tool_choice is a 400 naming the problem."""

from __future__ import annotations

import json
import shutil

import httpx
import jsonschema
import openai
import pytest
import transformers
from openai.lib.streaming.chat import ChatCompletionStreamState

from quill.server.api.app import create_app
from quill.server.api.openai.chat_tools import answer_format
from quill.server.api.openai.tool_calls.forced import named_schema, required_schema
from quill.server.config import ServerConfig
from quill.server.engine.outputs import CompletionOutput, RequestOutput
from quill.server.hosting import ModelHost
from tests.hub_checkpoints import MISTRAL_TOOLS_TEMPLATE
from tests.models.test_chat_template import TOOL_CHAT, TOOLS
from tests.server.api.test_whole_answers import ScriptedStream

HUB = {"llama": "quill-test/tiny-llama-chat", "qwen": "quill-test/tiny-qwen3", "mistral": "quill-test/tiny-mistral",
       "phi3": "quill-test/tiny-phi3"}  # phi3: a "tool_use" template beside its default one, in no known call format
ASK = [{"role": "user", "content": "Weather in Elsinore?"}]
WEATHER, TIME = {"city": "Elsinore"}, {}

# model -> (its answer, the content beside the calls, the calls as (name, arguments))
ANSWERS = {
    "qwen": ('Looking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Elsinore"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Looking.\n",
             [("get_weather", WEATHER), ("get_time", TIME)]),
    "llama": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Elsinore"}}', None,
              [("get_weather", WEATHER)]),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Elsinore"}}, '
                '{"name": "get_time", "arguments": {}}]', None, [("get_weather", WEATHER), ("get_time", TIME)]),
    "mistral-v11": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Elsinore"}', None, [("get_weather", WEATHER)]),
}
MARKUP = ("<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]")


@pytest.fixture(scope="module")
def app(hub_cache, tmp_path_factory):
    template = tmp_path_factory.mktemp("templates") / "mistral.jinja"
    template.write_text(MISTRAL_TOOLS_TEMPLATE)
    checkpoints = hub_cache[1]
    config = ServerConfig(models=[f"{name}={checkpoints[repo].path}" for name, repo in HUB.items()]
                          + ["shakespeare=shakespeare-transformer"],
                          chat_templates=[f"mistral={template}"], device="cpu", dtype="float32",
                          cache_bytes=4 * 2**20, block_size=4, max_tokens_limit=64)
    host = ModelHost.load(config)
    for hosted in host.models.values():  # every answer here is scripted: prompts with tools may pass the tiny context
        hosted.max_model_len = 4096
    host.start()
    yield create_app(host, config)
    host.shutdown()


@pytest.fixture
async def oai(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as http:
        yield openai.AsyncOpenAI(base_url="http://quill.test/v1", api_key="unused", http_client=http, max_retries=0)


def scripted(app, monkeypatch, model: str, pieces: list[str], finish: str = "stop") -> list:
    """The engine of `model` answers `pieces`, one output each; returns the (prompt ids, params) submitted."""
    outputs = [RequestOutput("r", [CompletionOutput(0, piece, [5], None, finish if i == len(pieces) - 1 else None)],
                             i == len(pieces) - 1, 3) for i, piece in enumerate(pieces)]
    submitted = []

    def submit(prompt_ids, params, request_id):
        submitted.append((prompt_ids, params))
        return ScriptedStream(outputs)

    monkeypatch.setattr(app.state.host.get(model).engine, "submit", submit)
    return submitted


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


async def streamed(oai, model: str, argument_pieces: list | None = None):
    state, contents = ChatCompletionStreamState(), []
    async for chunk in await oai.chat.completions.create(model=model, messages=ASK, tools=TOOLS, stream=True):
        state.handle_chunk(chunk)
        contents += [c.delta.content for c in chunk.choices if c.delta.content]
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:  # a call opens with its id, type and name, arguments ""
                assert (call.id is not None) == (call.function.name is not None)
                if call.id is not None:
                    assert call.type == "function" and call.function.arguments == ""
                elif argument_pieces is not None:
                    argument_pieces.append(call.function.arguments)
    assert not any(m in text for text in contents for m in MARKUP)
    return state.get_final_completion()


@pytest.mark.parametrize("case", list(ANSWERS))
async def test_calls_stream_into_the_plain_answers_calls_wherever_the_answer_is_cut(app, oai, monkeypatch, case):
    model = case.split("-")[0]
    answer, content, calls = ANSWERS[case]
    scripted(app, monkeypatch, model, [answer])
    plain = await oai.chat.completions.create(model=model, messages=ASK, tools=TOOLS)
    (choice,) = plain.choices
    assert (choice.message.content, calls_of(choice.message), choice.finish_reason) == (content, calls, "tool_calls")
    assert all(c.id.startswith("chatcmpl-tool-") and c.type == "function" for c in choice.message.tool_calls)
    for pieces in [[answer[:cut], answer[cut:]] for cut in range(len(answer) + 1)]:
        scripted(app, monkeypatch, model, pieces)
        (choice,) = (await streamed(oai, model)).choices
        assert ((choice.message.content or None), calls_of(choice.message), choice.finish_reason) == \
            (content, calls, "tool_calls"), pieces
    scripted(app, monkeypatch, model, list(answer))  # a character at a time: the arguments go out as they arrive
    argument_pieces = []
    (choice,) = (await streamed(oai, model, argument_pieces)).choices
    assert (calls_of(choice.message), choice.finish_reason) == (calls, "tool_calls")
    assert len(argument_pieces) == sum(len(json.dumps(arguments)) for _, arguments in calls)


async def test_an_answer_without_calls_is_plain_content_and_tool_choice_none_reads_no_calls(app, oai, monkeypatch):
    scripted(app, monkeypatch, "qwen", ["It is cold in <Elsinore>."])
    done = await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS)
    assert (done.choices[0].message.content, done.choices[0].message.tool_calls) == ("It is cold in <Elsinore>.", None)
    assert done.choices[0].finish_reason == "stop"
    answer = ANSWERS["qwen"][0]
    scripted(app, monkeypatch, "qwen", [answer])
    done = await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, tool_choice="none")
    assert (done.choices[0].message.content, done.choices[0].finish_reason) == (answer, "stop")
    scripted(app, monkeypatch, "qwen", [answer[:70]], finish="length")  # cut inside the first call's arguments
    done = await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS)
    (call,) = done.choices[0].message.tool_calls  # what arrived of it, as a stream would have sent it
    assert (call.function.name, call.function.arguments, done.choices[0].finish_reason) == \
        ("get_weather", '{"city": "El', "length")


@pytest.mark.parametrize("model", ["llama", "qwen"])
async def test_the_prompt_with_tools_and_a_history_of_calls_is_transformers(app, oai, monkeypatch, hub_cache, model):
    auto = transformers.AutoTokenizer.from_pretrained(hub_cache[1][HUB[model]].path)
    # As a client sends the history back: the calls' arguments as JSON strings, content null beside them.
    messages = [{**m, "content": None, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])
                           if isinstance(c["function"]["arguments"], dict) else c["function"]["arguments"]}}
        for c in m["tool_calls"]]} if "tool_calls" in m else m for m in TOOL_CHAT]
    expected = auto.apply_chat_template([{k: v for k, v in m.items() if v is not None} for m in messages],
                                        tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
    submitted = scripted(app, monkeypatch, model, ["Cold."])
    await oai.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=1)
    ((prompt_ids, params),) = submitted
    assert prompt_ids == list(expected)
    assert params.skip_special_tokens == (model == "qwen")  # <|python_tag|> is special: Llama's answers keep it


def test_each_models_call_format_is_found_from_its_template(app):
    host = app.state.host
    assert {name: answer_format(host.get(name), None).name for name in HUB if name != "phi3"} == \
        {"llama": "llama3_json", "qwen": "hermes", "mistral": "mistral"}
    assert answer_format(host.get("phi3"), None) is None
    assert answer_format(host.get("shakespeare"), None) is None
    assert answer_format(host.get("shakespeare"), "hermes").name == "hermes"


async def test_given_tools_a_checkpoints_tool_use_template_renders_the_prompt_as_in_transformers(
        app, oai, monkeypatch, hub_cache):
    auto = transformers.AutoTokenizer.from_pretrained(hub_cache[1][HUB["phi3"]].path)
    for tools in (TOOLS, None):  # transformers picks the "tool_use" template when given tools
        expected = auto.apply_chat_template(ASK, tools=tools, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        submitted = scripted(app, monkeypatch, "phi3", ["Cold."])
        await oai.chat.completions.create(model="phi3", messages=ASK, max_tokens=1,
                                          **(dict(tools=tools, tool_choice="none") if tools else {}))
        assert submitted[0][0] == list(expected)
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):  # auto needs to know the format
        await oai.chat.completions.create(model="phi3", messages=ASK, tools=TOOLS)


def tool(name="get_weather", **function):
    return {"type": "function", "function": {"name": name, **function}}


BAD = [
    (dict(tools=[{**tool(), "type": "retrieval"}]), "tools.0.type", "must be \"function\""),
    (dict(tools=[tool("get weather")]), "tools.0.function.name", "letters, digits"),
    (dict(tools=[tool(), tool()]), "tools.1.function.name", "given twice"),
    (dict(tools=[tool(parameters={"type": "array"})]), "tools.0.function.parameters", "JSON schema of an object"),
    (dict(tools=[tool(parameters=[1])]), "tools.0.function.parameters", None),
    (dict(tools=[tool(paramters={})]), "tools.0.function.paramters", "Unrecognized"),
    (dict(tools=[{"type": "function"}]), "tools.0.function", None),
    (dict(tools=[tool()], tool_choice="sometimes"), "tool_choice", "must be one of"),
    (dict(tools=[tool()], tool_choice={"type": "function", "function": {"name": "get_tide"}}),
     "tool_choice.function.name", "'get_tide', which is not among the tools (get_weather)"),
    (dict(tool_choice={"type": "function", "function": {"name": "get_tide"}}), "tool_choice.function.name",
     "none are given"),
    (dict(tools=[tool()], tool_choice={"type": "retrieval", "function": {"name": "get_weather"}}),
     "tool_choice.type", None),
    (dict(tool_choice="required"), "tool_choice", "needs tools"),
    (dict(tools=[tool()], tool_choice="required", response_format={"type": "json_object"}), "tool_choice",
     "already constrains"),
    (dict(model="shakespeare", tools=[tool()]), "tools", "does not support tools"),
]


@pytest.mark.parametrize("body, param, words", BAD, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD)])
async def test_bad_tools_and_tool_choice_are_400s_naming_the_problem(oai, body, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        await oai.chat.completions.create(**{"model": "qwen", "messages": ASK, **body})
    error = info.value.body
    assert error["param"] == param or (words is None and error["param"].startswith(param))
    if words:
        assert words in error["message"]


async def test_tgi_messages_api_clients_read_the_same_calls(app, monkeypatch):
    """huggingface_hub's types, generated from TGI's own spec, say TGI answers arguments as a JSON string too:
    the Messages API's calls are OpenAI's."""
    from huggingface_hub import ChatCompletionOutput, ChatCompletionStreamOutput

    answer, _, calls = ANSWERS["qwen"]
    scripted(app, monkeypatch, "qwen", [answer])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as http:
        body = {"model": "qwen", "messages": ASK, "tools": TOOLS}
        plain = ChatCompletionOutput.parse_obj_as_instance((await http.post("/v1/chat/completions", json=body)).text)
        assert [(c.function.name, json.loads(c.function.arguments)) for c in plain.choices[0].message.tool_calls] \
            == calls
        r = await http.post("/v1/chat/completions", json={**body, "stream": True})
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line and line != "data: [DONE]"]
    chunks = [ChatCompletionStreamOutput.parse_obj_as_instance(e) for e in events]
    names = [t.function.name for c in chunks for t in c.choices[0].delta.tool_calls or [] if t.function.name]
    assert names == [name for name, _ in calls]


async def test_tokenize_shows_the_tools_as_the_chat_route_does(app, hub_cache):
    auto = transformers.AutoTokenizer.from_pretrained(hub_cache[1][HUB["qwen"]].path)
    expected = auto.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quill.test") as http:
        r = await http.post("/tokenize", json={"model": "qwen", "messages": ASK, "tools": TOOLS})
        assert r.json()["tokens"] == list(expected)
        r = await http.post("/tokenize", json={"model": "qwen", "messages": ASK, "tools": [tool("a b")]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.0.function.name"


FORCED = {  # tool_choice -> the answer constrained decoding would hold to its schema, and the calls it reads as
    "required": ('[{"name": "get_weather", "parameters": {"city": "Elsinore"}}, {"name": "get_time", "parameters": {}}]',
                 [("get_weather", WEATHER), ("get_time", TIME)]),
    "named": ('{"city": "Elsinore"}', [("get_weather", WEATHER)]),
}


@pytest.mark.parametrize("choice", list(FORCED))
async def test_forced_answers_read_as_calls_plain_and_streamed(app, oai, monkeypatch, choice):
    """The route's side of "required" and a named function: the schema it constrains the answer to, and the
    calls a scripted answer to that schema reads as."""
    from quill.server.api.openai import chat

    schemas, constrained = [], chat._constrained
    monkeypatch.setattr(chat, "_constrained",
                        lambda params, schema: schemas.append(schema) or constrained(params, schema))
    answer, calls = FORCED[choice]
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    scripted(app, monkeypatch, "qwen", [answer])
    done = await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, tool_choice=tool_choice)
    assert (done.choices[0].message.content, calls_of(done.choices[0].message)) == (None, calls)
    assert done.choices[0].finish_reason == "tool_calls"
    functions = [t["function"] for t in TOOLS]
    assert schemas == [named_schema(functions[0]) if choice == "named" else required_schema(functions)]
    for cut in range(len(answer) + 1):
        scripted(app, monkeypatch, "qwen", [answer[:cut], answer[cut:]])
        state = ChatCompletionStreamState()
        async for chunk in await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                                            tool_choice=tool_choice, stream=True):
            state.handle_chunk(chunk)
        (choice_,) = state.get_final_completion().choices
        assert (choice_.message.content or None, calls_of(choice_.message)) == (None, calls), cut


async def test_each_of_n_choices_reads_its_own_calls(app, oai, monkeypatch):
    answer, content, calls = ANSWERS["qwen"]
    text = "It is cold <there>."
    half = len(answer) // 2
    outputs = [RequestOutput("r", [CompletionOutput(0, answer[:half], [5]), CompletionOutput(1, text[:12], [5])],
                             False, 3),
               RequestOutput("r", [CompletionOutput(1, text[12:], [5], None, "stop")], False, 3),
               RequestOutput("r", [CompletionOutput(0, answer[half:], [5], None, "stop")], True, 3)]
    monkeypatch.setattr(app.state.host.get("qwen").engine, "submit", lambda *a, **k: ScriptedStream(outputs))
    plain = await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, n=2)
    state = ChatCompletionStreamState()
    async for chunk in await oai.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, n=2, stream=True):
        state.handle_chunk(chunk)
    for done in (plain, state.get_final_completion()):
        first, second = sorted(done.choices, key=lambda c: c.index)
        assert (first.message.content, calls_of(first.message), first.finish_reason) == (content, calls, "tool_calls")
        assert (second.message.content, second.message.tool_calls or None, second.finish_reason) == (text, None, "stop")



@pytest.fixture(scope="module")
def long_qwen(hub_cache, tmp_path_factory):
    """tiny-qwen3 with room for a prompt with tools (its RoPE weights do not depend on the length), on a real
    engine: what it generates is its own."""
    directory = tmp_path_factory.mktemp("long-qwen") / "qwen"
    shutil.copytree(hub_cache[1][HUB["qwen"]].path, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    server_config = ServerConfig(models=[f"qwen={directory}"], device="cpu", dtype="float32", cache_bytes=8 * 2**20,
                                 block_size=16, max_tokens_limit=512)
    host = ModelHost.load(server_config)
    host.start()
    yield create_app(host, server_config)
    host.shutdown()


@pytest.mark.parametrize("choice", ["required", "named"])
async def test_a_random_weight_model_forced_to_call_answers_a_valid_call(long_qwen, choice):
    """Real generation by a tiny random-weight model: the grammar holds every answer to a call of a listed
    function whose arguments match its schema, whatever the weights would rather write."""
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    # Bounded arguments: a grammar cannot make a random model end a free string, but it holds it to these.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                 "type": "object", "properties": {"city": {"enum": ["Elsinore", "Wittenberg"]},
                                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                 "required": ["city", "days"], "additionalProperties": False}}},
             {"type": "function", "function": {"name": "get_time", "parameters": {
                 "type": "object", "properties": {}, "additionalProperties": False}}}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    read = 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=long_qwen), base_url="http://quill.test") as http:
        oai = openai.AsyncOpenAI(base_url="http://quill.test/v1", api_key="unused", http_client=http, max_retries=0)
        for seed in range(4):
            done = await oai.chat.completions.create(model="qwen", messages=ASK, tools=tools, tool_choice=tool_choice,
                                                     temperature=1.0, seed=seed, max_tokens=400)
            (answer,) = done.choices
            # "required" holds the answer to a list of calls, which a random model may go on extending until
            # max_tokens: every call it finished must still be valid.
            assert answer.finish_reason in ("tool_calls", "length") and answer.message.content is None, answer
            for call in answer.message.tool_calls or []:
                assert call.function.name in schemas
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
                read += 1
            if choice == "named":
                assert answer.finish_reason == "tool_calls" and len(answer.message.tool_calls) == 1, answer
    assert read, "no answer held a call: nothing was checked"
