"""Each family's call format read from scripted answers, whole and cut at every point: the same calls and
content either way, and no call markup in the content."""

from __future__ import annotations

import json

import pytest

from server.api.tool_calls import ToolCallStream, split_answer, tool_call_format
from server.api.tool_calls.forced import NamedFormat, RequiredFormat

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


def read(name: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict]]]:
    stream = ToolCallStream(format_of(name))
    content, calls = "", []
    for piece in pieces:
        delta = stream.push(piece)
        content += delta.content
        calls += delta.calls
    delta = stream.finish()
    return content + delta.content, [(c.name, json.loads(c.arguments)) for c in calls + delta.calls]


@pytest.mark.parametrize("name, answer, content, calls", ANSWERS, ids=[f"{a[0]}-{i}" for i, a in enumerate(ANSWERS)])
def test_calls_and_content_are_the_same_however_the_answer_is_cut(name, answer, content, calls):
    whole = split_answer(format_of(name), answer)
    assert (whole.content, [(c.name, json.loads(c.arguments)) for c in whole.calls]) == (content, calls)
    for cut in range(len(answer) + 1):
        assert read(name, [answer[:cut], answer[cut:]]) == (content, calls), cut
    assert read(name, list(answer)) == (content, calls)  # a character at a time
    if calls:
        assert not any(m in content for m in MARKUP)


def test_content_is_released_as_soon_as_it_cannot_begin_a_marker():
    stream = ToolCallStream(tool_call_format("hermes"))
    assert stream.push("I will <to").content == "I will "
    assert stream.push("day").content == "<today"
    llama = ToolCallStream(tool_call_format("llama3_json"))
    assert llama.push("  ").content == "" and llama.push("Hi").content == "  Hi"
    assert llama.push(' {"name"').content == ' {"name"'  # after text, JSON is just text


def test_calls_are_sent_once_whole_hermes_at_each_closing_tag():
    stream = ToolCallStream(tool_call_format("hermes"))
    assert stream.push('<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}').calls == []
    (call,) = stream.push("</tool_call>\n<tool_call>").calls
    assert call.name == "get_time" and call.id.startswith("chatcmpl-tool-")
    assert stream.finish().calls == []  # the open second block holds nothing


def test_arguments_given_as_a_json_string_are_that_object():
    (call,) = split_answer(tool_call_format("hermes"),
                           '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>').calls
    assert json.loads(call.arguments) == {"x": 1}
