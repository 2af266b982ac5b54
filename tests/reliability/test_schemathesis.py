"""Property-based API testing from our own OpenAPI document: every operation, valid and invalid inputs.

No 5xx, no response that breaks the schema the document gives for it, and the server is still
serving afterwards.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from quill.server.api.app import create_app
from quill.server.hosting import ModelHost
from tests.server.api.conftest import server_config


@pytest.fixture(scope="module")
def fuzzed_app(tiny_checkpoints, tmp_path_factory):
    # A chat template that reads names, roles and keyword arguments, so fuzzed chats reach the engine.
    template = tmp_path_factory.mktemp("chat") / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m.name or m.role }}: {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}{{ speaker | default('assistant') }}:{% endif %}")
    config = server_config(tiny_checkpoints, max_tokens_limit=64, chat_templates=[str(template)])
    host = ModelHost.load(config)
    host.start()
    yield create_app(host, config)
    host.shutdown()


@pytest.fixture(scope="module")
def fuzzed_schema(fuzzed_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)


# Operations without inputs have no invalid inputs to generate: positive cases only.
CASES = [(op, GenerationMode.POSITIVE) for op in ("GET /health", "GET /ready", "GET /metrics", "GET /v1/models",
                                                  "GET /info")] + [
    (op, mode) for op in ("POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize", "POST /detokenize",
                          "POST /generate", "POST /generate_stream", "POST /", "GET /tokenizer_info")
    for mode in GenerationMode
]


@pytest.mark.parametrize("operation,mode", CASES, ids=[f"{op}-{mode.value}" for op, mode in CASES])
def test_every_operation_holds_up(fuzzed_schema, operation, mode):
    method, path = operation.split()
    found = [r.ok() for r in fuzzed_schema.get_all_operations()
             if r.ok().method.upper() == method and r.ok().path == path]
    assert found, f"{operation} is not in the OpenAPI document"

    @given(case=found[0].as_strategy(generation_mode=mode))
    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def holds_up(case):
        response = case.call()
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                                 content_type_conformance])

    holds_up()


def test_server_alive_after_fuzzing(fuzzed_app):
    import asyncio

    async def probe():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fuzzed_app), base_url="http://t") as c:
            ready = await c.get("/ready")
            done = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "ignore_eos": True})
            return ready.status_code, done.status_code

    assert asyncio.run(probe()) == (200, 200)
