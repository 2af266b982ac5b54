"""Each family's call format read from scripted answers, whole and cut at every point: the same calls and
content either way, and no call markup in the content."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quill.server.api.openai.tool_calls import ToolCallStream, split_answer, tool_call_format
from quill.server.api.openai.tool_calls.forced import NamedFormat, RequiredFormat

WEATHER = {"city": "Elsinore", "unit": "celsius"}
TIME = {"zone": "CET"}

# (format, answer, expected content, expected calls as (name, arguments))
ANSWERS = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Elsinore", "unit": '
               '"celsius"}}\n</tool_call>', "Let me look.\n", [("get_weather", WEATHER)]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Elsinore", "unit": "celsius"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>', "",
     [("get_weather", WEATHER), ("get_time", TIME)]),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}', "", [("get_time", TIME)]),  # unclosed
    ("hermes", "a < b, and <tool_ is no tag", "a < b, and <tool_ is no tag", []),
    ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Elsinore", "unit": "celsius"}}', "",
     [("get_weather", WEATHER)]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Elsinore", "unit": "celsius"}}; '
                    '{"name": "get_time", "parameters": {"zone": "CET"}}', "",
     [("get_weather", WEATHER), ("get_time", TIME)]),
    ("llama3_json", 'Sure: {"name": "get_time", "parameters": {}}', 'Sure: {"name": "get_time", "parameters": {}}', []),
    ("llama3_json", '{"a": 1}', '{"a": 1}', []),
    ("mistral", 'Looking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Elsinore", "unit": "celsius"}},'
                ' {"name": "get_time", "arguments": {"zone": "CET"}}]', "Looking.",
     [("get_weather", WEATHER), ("get_time", TIME)]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Elsinore", "unit": "celsius"}[TOOL_CALLS]get_time[ARGS]'
                '{"zone": "CET"}', "", [("get_weather", WEATHER), ("get_time", TIME)]),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}, "id": "a1B2c3D4e"}, '
                '{"name": "get_time", "arguments": {"zone": "CET"}}]', "", [("get_time", TIME), ("get_time", TIME)]),
    ("mistral", "[TOOL is not [TOOL_CALLS", "[TOOL is not [TOOL_CALLS", []),
    ("required", '[{"name": "get_weather", "parameters": {"city": "Elsinore", "unit": "celsius"}}]', "",
     [("get_weather", WEATHER)]),
    ("named:get_time", '{"zone": "CET"}', "", [("get_time", TIME)]),
]
MARKUP = ("<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]")


def format_of(name: str):
    if name == "required":
        return RequiredFormat()
    if name.startswith("named:"):
        return NamedFormat(name.split(":")[1])
    return tool_call_format(name)


def read(name: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """What a client assembles from the deltas: each call opened once with its name, then its arguments' pieces."""
    stream = ToolCallStream(format_of(name))
    content, calls = "", {}
    for delta in [stream.push(piece) for piece in pieces] + [stream.finish()]:
        content += delta.content
        for piece in delta.calls:
            if piece.id is not None:
                assert piece.index == len(calls) and piece.arguments == ""
                calls[piece.index] = [piece.name, ""]
            else:
                calls[piece.index][1] += piece.arguments
    assert [[c.name, c.arguments] for c in stream.calls] == list(calls.values())
    return content, [(name, arguments) for name, arguments in calls.values()]


@pytest.mark.parametrize("name, answer, content, calls", ANSWERS, ids=[f"{a[0]}-{i}" for i, a in enumerate(ANSWERS)])
def test_calls_and_content_are_the_same_however_the_answer_is_cut(name, answer, content, calls):
    whole_content, whole_calls = split_answer(format_of(name), answer)
    assert (whole_content, [(c.name, json.loads(c.arguments)) for c in whole_calls]) == (content, calls)
    whole = (whole_content, [(c.name, c.arguments) for c in whole_calls])  # arguments the very same text
    for cut in range(len(answer) + 1):
        assert read(name, [answer[:cut], answer[cut:]]) == whole, cut
    assert read(name, list(answer)) == whole  # a character at a time
    if calls:
        assert not any(m in content for m in MARKUP)


def test_content_is_released_as_soon_as_it_cannot_begin_a_marker():
    stream = ToolCallStream(tool_call_format("hermes"))
    assert stream.push("I will <to").content == "I will "
    assert stream.push("day").content == "<today"
    llama = ToolCallStream(tool_call_format("llama3_json"))
    assert llama.push("  ").content == "" and llama.push("Hi").content == "  Hi"
    assert llama.push(' {"name"').content == ' {"name"'  # after text, JSON is just text


def test_a_call_opens_once_its_name_is_read_and_its_arguments_go_out_as_they_arrive():
    stream = ToolCallStream(tool_call_format("hermes"))
    assert stream.push('<tool_call>\n{"name": "get_ti').calls == []
    (opened,) = stream.push('me", "arguments": ').calls
    assert (opened.index, opened.name, opened.arguments) == (0, "get_time", "")
    assert opened.id.startswith("chatcmpl-tool-")
    assert [p.arguments for p in stream.push('{"zone": "C').calls] == ['{"zone": "C']
    assert [p.arguments for p in stream.push('ET"}}\n</tool_call>\n<tool_call>').calls] == ['ET"}']
    assert stream.finish().calls == [] and [c.arguments for c in stream.calls] == ['{"zone": "CET"}']


def test_arguments_are_the_text_the_model_wrote_and_one_written_other_ways_goes_out_whole():
    _, (call,) = split_answer(tool_call_format("hermes"), '<tool_call>{"name": "f", "arguments": {"b":1,  "a": 2}}')
    assert call.arguments == '{"b":1,  "a": 2}'
    stream = ToolCallStream(tool_call_format("hermes"))
    assert stream.push('<tool_call>{"arguments": {"a": 1}, ').calls == []  # name last: read once whole
    (opened, arguments) = stream.push('"name": "f"}</tool_call>').calls
    assert (opened.name, arguments.arguments) == ("f", '{"a": 1}')


def test_arguments_given_as_a_json_string_are_that_object():
    _, (call,) = split_answer(tool_call_format("hermes"),
                              '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert json.loads(call.arguments) == {"x": 1}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_cutting_of_an_answer_reads_as_the_whole(data):
    name, answer, _, _ = data.draw(st.sampled_from(ANSWERS))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(answer)), max_size=12)))
    pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)])]
    content, calls = split_answer(format_of(name), answer)
    assert read(name, pieces) == (content, [(c.name, c.arguments) for c in calls])
