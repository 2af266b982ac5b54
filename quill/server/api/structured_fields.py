"""The request fields that constrain an answer, in each dialect, and their one meaning: a `StructuredOutput`.

OpenAI: `response_format` ({"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema,
strict}}) on chat, and on completions as vLLM accepts it. vLLM: `structured_outputs` ({json | regex | choice |
grammar | json_object}) and its older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. TGI:
`parameters.grammar` ({"type": "json" | "regex", "value": ...}) on /generate, and on the Messages API a
`response_format` of the same shape ("json_object" too, as TGI's docs write it). A request may name one
constraint only. `check_constraint` compiles it before the request is submitted (quill/server/structured/).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from quill.server.hosting import HostedModel
from quill.server.sampling import StructuredOutput
from quill.server.structured import GrammarError

from .request_schema import RequestSchema
from .validation import invalid


class JsonSchemaFormat(RequestSchema):
    name: str | None = None  # OpenAI requires it; it names the schema and changes nothing generated
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the output always follows the schema here: strict or not


class ResponseFormat(RequestSchema):
    """OpenAI's response_format, and TGI's Messages API one ("json"/"json_object"/"regex" with "value")."""

    type: Literal["text", "json_object", "json_schema", "json", "regex"]
    json_schema: JsonSchemaFormat | None = None
    value: Any = None  # TGI: the schema (json, json_object) or the pattern (regex)


class StructuredOutputsField(RequestSchema):
    """vLLM's structured_outputs: exactly one of the constraints."""

    json_: dict[str, Any] | str | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Accepted: Quill's JSON grammars already allow no free whitespace, and there is no other backend.
    disable_any_whitespace: bool | None = None
    disable_fallback: bool | None = None


class TGIGrammar(RequestSchema):
    type: Literal["json", "regex", "json_object"]
    value: Any


class GuidedFields(RequestSchema):
    """vLLM's constraint fields, for completions and chat."""

    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    response_format: ResponseFormat | None = None

    def structured_output(self) -> tuple[StructuredOutput | None, str | None]:
        """The one constraint the request names and the field it came in (None, None if none)."""
        found = []
        if self.response_format is not None:
            found += [(c, "response_format") for c in [from_response_format(self.response_format)] if c]
        if self.structured_outputs is not None:
            found += [(c, "structured_outputs") for c in from_structured_outputs(self.structured_outputs)]
        guided = {"guided_json": self.guided_json, "guided_regex": self.guided_regex,
                  "guided_choice": self.guided_choice, "guided_grammar": self.guided_grammar}
        for name, value in guided.items():
            if value is not None:
                found.append((constraint(name.removeprefix("guided_"), value, name), name))
        if len(found) > 1:
            raise invalid(f"only one constraint per request; got {found[0][1]} and {found[1][1]}", found[1][1])
        return found[0] if found else (None, None)


def constraint(kind: str, value: Any, param: str) -> StructuredOutput:
    """One constraint from vLLM's or TGI's (kind, value) pair; 400 naming `param` if the value has the wrong form."""
    if kind in ("json", "json_object") and value is not True:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise invalid(f"{param} is not valid JSON: {e}", param) from None
        if not isinstance(value, (dict, bool)):
            raise invalid(f"{param} must be a JSON schema (an object), got {type(value).__name__}", param)
        return StructuredOutput.json_schema(value)
    if kind in ("json", "json_object"):
        return StructuredOutput("json_object")
    if kind in ("regex", "grammar"):
        if not isinstance(value, str) or not value:
            raise invalid(f"{param} must be a non-empty string", param)
        return StructuredOutput(kind, value)
    if kind == "choice":
        if not value or not all(isinstance(c, str) and c for c in value):
            raise invalid(f"{param} must be a non-empty list of non-empty strings", param)
        return StructuredOutput.choice(value)
    raise invalid(f"{param}: unknown constraint {kind!r}", param)


def from_response_format(f: ResponseFormat) -> StructuredOutput | None:
    if f.type == "text":
        return None
    if f.type == "json_schema" and f.json_schema is None and isinstance(f.value, dict) and "schema" in f.value:
        return constraint("json", f.value["schema"], "response_format.value.schema")  # TGI 3's {name, schema}
    if f.type == "json_schema":
        if f.json_schema is None or f.json_schema.schema_ is None:
            raise invalid('response_format of type "json_schema" needs json_schema.schema', "response_format")
        return constraint("json", f.json_schema.schema_, "response_format.json_schema.schema")
    if f.type == "regex":
        return constraint("regex", f.value, "response_format.value")
    # "json_object": OpenAI's any JSON object, or with TGI's "value" that schema; "json": TGI's schema.
    return constraint("json", True if f.value is None else f.value, "response_format.value")


def from_structured_outputs(s: StructuredOutputsField) -> list[StructuredOutput]:
    named = [(k, v) for k, v in (("json", s.json_), ("regex", s.regex), ("choice", s.choice), ("grammar", s.grammar))
             if v is not None]
    if s.json_object:
        named.append(("json_object", True))
    if len(named) > 1:
        raise invalid(f"structured_outputs takes one constraint; got {' and '.join(k for k, _ in named)}",
                      "structured_outputs")
    return [constraint(k, v, f"structured_outputs.{k}") for k, v in named]


def from_tgi_grammar(grammar: TGIGrammar | None, param: str = "parameters.grammar") -> StructuredOutput | None:
    return None if grammar is None else constraint(grammar.type, grammar.value, f"{param}.value")


async def check_constraint(hosted: HostedModel, structured: StructuredOutput | None, param: str | None) -> None:
    """Compile the constraint (cached) within the server's time limit; 400 naming `param` if it is refused.
    Call it before submitting any request whose SamplingParams.structured is set, whatever set it."""
    if structured is None:
        return
    try:
        await hosted.grammars.check(structured)
    except GrammarError as e:
        raise invalid(f"{param}: {e}" if param else str(e), param) from None
