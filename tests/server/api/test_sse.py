"""SSE framing: compact JSON, UTF-8 as it is, one blank line after each event."""

from __future__ import annotations

from quill.server.api.sse import sse_event


def test_an_event_is_compact_json_in_utf8():
    assert sse_event({"text": "é ✓", "logprob": -1.5, "finish_reason": None, "top": [float("-inf")]}) == \
        'data: {"text":"é ✓","logprob":-1.5,"finish_reason":null,"top":[-Infinity]}\n\n'.encode()


def test_a_string_is_sent_as_it_is():
    assert sse_event("[DONE]") == b"data: [DONE]\n\n"
