"""The JSON schemas that tool_choice "required" and a named function hold answers to: every answer they
accept reads as calls of the listed functions with arguments their schemas accept, and what they refuse
is not such a call."""

from __future__ import annotations

import json

import jsonschema
import pytest

from quill.server.api.openai.tool_calls import split_answer
from quill.server.api.openai.tool_calls.forced import NamedFormat, RequiredFormat, named_schema, required_schema

WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": False}}
TIME = {"name": "get_time", "description": "The time now", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}
NOON = {"name": "noon"}  # takes no arguments
FUNCTIONS = [WEATHER, TIME, NOON]

ACCEPTED = [
    [{"name": "get_weather", "parameters": {"city": "Elsinore"}}],
    [{"name": "get_weather", "parameters": {"city": "Elsinore", "unit": "celsius"}},
     {"name": "get_time", "parameters": {"zone": "CET"}}],
    [{"name": "noon", "parameters": {}}],
]
REFUSED = [
    [],  # no call
    {"name": "get_time", "parameters": {"zone": "CET"}},  # not a list
    [{"name": "get_tide", "parameters": {}}],  # an unknown function
    [{"name": "get_weather", "parameters": {"unit": "celsius"}}],  # a required argument missing
    [{"name": "get_weather", "parameters": {"city": "Elsinore", "unit": "kelvin"}}],  # outside the enum
    [{"name": "get_weather", "parameters": {"city": "Elsinore", "mood": "grim"}}],  # not allowed
    [{"name": "get_time"}],  # no parameters
]


def validates(schema: dict, value) -> bool:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize("answer", ACCEPTED)
def test_required_accepts_calls_of_listed_functions_and_reads_them_back(answer):
    schema = required_schema(FUNCTIONS)
    assert validates(schema, answer)
    content, calls = split_answer(RequiredFormat(), json.dumps(answer))
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(a["name"], a["parameters"]) for a in answer]
    by_name = {f["name"]: f for f in FUNCTIONS}
    for call in calls:  # each call's arguments are what its own schema accepts
        assert validates(named_schema(by_name[call.name]), json.loads(call.arguments))


@pytest.mark.parametrize("answer", REFUSED)
def test_required_refuses_what_is_not_a_call_of_a_listed_function(answer):
    assert not validates(required_schema(FUNCTIONS), answer)


def test_one_function_needs_no_any_of():
    assert required_schema([TIME])["items"]["properties"]["name"] == {"type": "string", "enum": ["get_time"]}


def test_named_schema_is_the_functions_parameters_and_its_answer_one_call():
    schema = named_schema(WEATHER)
    assert validates(schema, {"city": "Elsinore"}) and not validates(schema, {"unit": "celsius"})
    assert validates(named_schema(NOON), {}) and not validates(named_schema(NOON), [])
    _, (call,) = split_answer(NamedFormat("get_weather"), '{"city": "Elsinore"}')
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Elsinore"})
