"""Constrained requests through the engine: every output matches, whatever else shares the batch."""

from __future__ import annotations

import json
import re

import pytest

from quill.server.sampling import SamplingParams, StructuredOutput
from tests.server.engine.helpers import run_to_completion
from tests.server.engine.test_engine import engine, loaded_model

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                       "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
PROMPT = [3, 4, 5, 6, 7, 8, 9, 10]


def is_valid(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "age", "tags"} and isinstance(value["name"], str) and len(value["name"]) <= 8
            and isinstance(value["age"], int) and 0 <= value["age"] <= 120
            and all(t in ("a", "b") for t in value["tags"]) and len(value["tags"]) <= 2)


@pytest.fixture(params=["lstm", "gcnn", "transformer-llama"])
def loaded(request, tiny_tokenizer):
    return loaded_model(request.param, tiny_tokenizer)


def test_json_schema_outputs_validate_and_free_rows_are_untouched(loaded):
    structured = StructuredOutput.json_schema(SCHEMA)
    free = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    alone = run_to_completion_one(loaded, free)

    core = engine(loaded)
    for i in range(4):
        core.add_request(f"c{i}", PROMPT, SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured=structured))
    core.add_request("free", PROMPT, free)
    results = run_to_completion(core)
    for i in range(4):
        out = results[f"c{i}"][0]
        assert out["finish_reason"] == "stop", out
        assert is_valid(out["text"]), out["text"]
    assert results["free"][0]["token_ids"] == alone  # a seeded free row: the same tokens beside constrained ones


def run_to_completion_one(loaded, params: SamplingParams) -> list[int]:
    core = engine(loaded)
    core.add_request("free", PROMPT, params)
    return run_to_completion(core)["free"][0]["token_ids"]


def test_n_samples_each_follow_the_grammar(loaded):
    core = engine(loaded)
    core.add_request("r", PROMPT, SamplingParams(n=3, max_tokens=40, temperature=1.0, seed=3,
                                                 structured=StructuredOutput("regex", r"[ab]{2,5}-[0-9]{1,3}")))
    results = run_to_completion(core)
    for i in range(3):
        assert re.fullmatch(r"[ab]{2,5}-[0-9]{1,3}", results["r"][i]["text"]), results["r"][i]


def test_choice_and_greedy(loaded):
    core = engine(loaded)
    core.add_request("c", PROMPT, SamplingParams(max_tokens=20, temperature=0.0,
                                                 structured=StructuredOutput.choice(["yes", "no", "maybe"])))
    out = run_to_completion(core)["c"][0]
    assert out["text"] in ("yes", "no", "maybe") and out["finish_reason"] == "stop"


def test_beam_search_masks_each_beam_with_its_own_grammar(loaded):
    grammar = 'start: ("red" | "green" | "blue") " " ("cat" | "dog")'
    core = engine(loaded)
    core.add_request("b", PROMPT, SamplingParams(n=2, use_beam_search=True, beam_width=3, max_tokens=20,
                                                 temperature=0.0, structured=StructuredOutput("grammar", grammar)))
    results = run_to_completion(core)["b"]
    for i in range(2):
        assert re.fullmatch(r"(red|green|blue) (cat|dog)", results[i]["text"]), results[i]


def test_a_refused_grammar_is_refused_at_add(loaded):
    core = engine(loaded)
    with pytest.raises(ValueError, match="if"):
        core.add_request("x", PROMPT, SamplingParams(structured=StructuredOutput.json_schema({"if": {}})))


def test_masks_filled_on_a_thread_give_the_same_tokens(loaded):
    """The GPU's way (masks filled beside the forward pass) against the CPU's (filled first, in line)."""
    structured = StructuredOutput.json_schema(SCHEMA)
    outputs = []
    for overlaps in (False, True):
        core = engine(loaded)
        core.runner.grammar_masks.overlaps = overlaps
        for i in range(3):
            core.add_request(f"c{i}", PROMPT, SamplingParams(max_tokens=60, temperature=1.0, seed=i,
                                                             structured=structured))
        outputs.append(run_to_completion(core))
    assert outputs[0] == outputs[1]
