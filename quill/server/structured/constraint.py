"""What a request's output must match: a JSON schema, any JSON object, a regex, one of a few strings, or a grammar.

Only the source travels (as text, so it crosses the engine process's msgpack pipe as it is); the grammar
engine compiles it where it is used (quill/server/structured/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(slots=True, frozen=True)
class StructuredOutput:
    """kind "json_schema": spec is the schema as JSON text; "json_object": any JSON object, spec "";
    "regex": a regular expression the whole output matches; "choice": a JSON array of the allowed strings;
    "grammar": a Lark grammar (llguidance's dialect) or a GBNF one (told apart by its `::=`)."""

    kind: StructuredKind
    spec: str = ""

    def problem(self) -> str | None:
        """What is wrong with it, in words (SamplingParams raises it as a SamplingParamError); None if nothing."""
        if self.kind not in KINDS:
            return f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
        if not isinstance(self.spec, str):
            return f"spec must be a string, got {type(self.spec).__name__}"
        if self.kind != "json_object" and not self.spec:
            return f"a {self.kind} constraint needs a non-empty spec"
        if self.kind == "choice":
            try:
                choices = json.loads(self.spec)
            except ValueError:
                choices = None
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) and c for c in choices)):
                return "choice spec must be a JSON array of non-empty strings"
        return None

    @classmethod
    def json_schema(cls, schema: dict | bool | str) -> StructuredOutput:
        # Key order kept: properties are generated in the order the schema lists them.
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutput:
        return cls("choice", json.dumps(list(choices)))

    @property
    def key(self) -> tuple[str, str]:
        """What the compiled-grammar cache is keyed by."""
        return (self.kind, self.spec)
