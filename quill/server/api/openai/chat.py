"""OpenAI-compatible /v1/chat/completions, plain and streamed; the same route is TGI's Messages API.

The messages become a prompt through the model's chat template (chat_prompt.py); the rest is a
completion of that prompt: the same checks, defaults and engine as /v1/completions, answered in
the chat shape (`message`, or `delta` chunks with the role first; logprobs as
`logprobs.content[]`). huggingface_hub's InferenceClient, given a URL, sends the placeholder model
name "dummy" (TGI's docs say "tgi"): TGI serves one model and ignores it, so here it means the
default model, unless a hosted model has that name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from fastapi import APIRouter, Request

from quill.server import __version__
from quill.server.config import ServerConfig
from quill.server.engine import TokenLogprob
from quill.server.hosting import HostedModel
from quill.server.sampling import SamplingParams
from quill.server.sampling.params import MAX_LOGPROBS
from quill.server.structured.constraint import StructuredOutput

from ..errors import JSON_OR_SSE_RESPONSE, OPENAI_ERROR_RESPONSES, APIError
from ..generation import Submitted, answer, event_stream, resolve_model, start
from ..sampling_defaults import default_max_tokens
from ..sse import sse_event
from ..structured_fields import check_constraint
from ..token_texts import TokenTexts
from ..validation import check_context, check_max_tokens, check_sequences, invalid
from .chat_prompt import ChatPrompt, render_chat
from .chat_schemas import ChatCompletionRequest
from .chat_tools import ToolPlan, plan_tools
from .tool_calls import CallDelta, ToolCall, ToolCallStream, split_answer

router = APIRouter()

PLACEHOLDER_MODELS = ("tgi", "dummy")
SYSTEM_FINGERPRINT = f"quill-{__version__}"  # TGI's clients require the field
ROLE = "assistant"


@dataclass
class _AcceptedChat:
    """A request that passed every check: what to submit, and how to answer it."""

    hosted: HostedModel
    prompt: ChatPrompt
    params: SamplingParams
    logprobs: bool
    include_usage: bool
    tools: ToolPlan
    completion_id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, obj: str) -> dict:
        return {"id": self.completion_id, "object": obj, "created": self.created, "model": self.hosted.name,
                "system_fingerprint": SYSTEM_FINGERPRINT}


def _model_name(http: Request, name: str | None) -> str | None:
    host = http.app.state.host
    if name in PLACEHOLDER_MODELS and (host is None or name not in host.models):
        return None
    return name


def _validate(request: ChatCompletionRequest, config: ServerConfig, hosted: HostedModel) -> _AcceptedChat:
    """Everything checked before anything is submitted (and so before the first byte of a stream)."""
    max_tokens, max_param = request.max_tokens, "max_tokens"
    if request.max_completion_tokens is not None:
        max_tokens, max_param = request.max_completion_tokens, "max_completion_tokens"
    if max_tokens is not None:
        check_max_tokens(config, max_tokens, max_param)
    check_sequences(config, request.n, "n", request.use_beam_search)
    if request.use_beam_search:
        for name, clash in (("stop", bool(request.stop)), ("logprobs", request.logprobs)):
            if clash:
                raise invalid(f"{name} cannot be combined with beam search", name)
    if request.top_logprobs is not None:
        if not request.logprobs:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        if not 0 <= request.top_logprobs <= MAX_LOGPROBS:
            raise invalid(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {request.top_logprobs}",
                          "top_logprobs")
    request.check_forms(config)
    tools = plan_tools(request, hosted, config.tool_call_parser)
    prompt = render_chat(hosted, request, tools=tools.tools)
    if max_tokens is None:
        max_tokens = default_max_tokens(hosted, config, len(prompt.ids))
    params = request.to_sampling_params(hosted, max_tokens)
    if tools.format is not None and tools.format.keeps_special_tokens:  # its call marker is a special token
        params = replace(params, skip_special_tokens=False)
    if tools.schema is not None:
        params = _constrained(params, tools.schema)
    check_context(hosted, len(prompt.ids), max_tokens, param=max_param)  # after the settings, as for completions
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return _AcceptedChat(hosted, prompt, params, request.logprobs, include_usage, tools)


def _constrained(params: SamplingParams, schema: dict) -> SamplingParams:
    """`params` holding every answer to `schema` (tool_choice "required" or a named function)."""
    if params.structured is not None:  # two grammars for one answer: say which two, rather than pick one
        raise invalid("tool_choice \"required\" or a named function already constrains the answer; leave out "
                      "response_format and structured outputs", "tool_choice")
    return replace(params, structured=StructuredOutput.json_schema(schema))


class _Logprobs:
    """OpenAI's chat logprobs: per token its text, log-probability, UTF-8 bytes and best alternatives; a
    token's text is what it adds to the message (token_texts.py), its bytes are that text's."""

    def __init__(self, hosted: HostedModel, prompt_ids: list[int]):
        self.tokenizer = hosted.tokenizer
        self.prompt_ids = prompt_ids
        self.texts: dict[int, TokenTexts] = {}  # per choice, across the chunks of a stream

    @staticmethod
    def entry(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def content(self, index: int, token_ids: list[int], entries: list[TokenLogprob] | None, ends: bool) -> list[dict]:
        texts = self.texts.setdefault(index, TokenTexts(self.tokenizer, self.prompt_ids))
        content = []
        for i, (token_id, e) in enumerate(zip(token_ids, entries or [])):
            text, top = texts.next(token_id, e, is_last=ends and i == len(token_ids) - 1)
            content.append({**self.entry(text, e.logprob), "top_logprobs": [self.entry(t, lp) for _, t, lp in top]})
        return content


@router.post("/v1/chat/completions", responses={**OPENAI_ERROR_RESPONSES, **JSON_OR_SSE_RESPONSE})
async def create_chat_completion(request: ChatCompletionRequest, http: Request):
    hosted = resolve_model(http, _model_name(http, request.model))
    plan = _validate(request, http.app.state.config, hosted)
    constraint_field = "tool_choice" if plan.tools.schema is not None else request.structured_output()[1]
    await check_constraint(hosted, plan.params.structured, constraint_field)
    submitted = start(http, hosted, [(plan.prompt.ids, plan.prompt.text)], plan.params, [plan.completion_id])
    if request.stream:
        return event_stream(submitted, lambda _, s: _chunks(plan, s), _error_event,
                            lambda: _tail(plan, submitted[0].tracker.num_generated))
    return await answer(http, submitted, lambda outputs: _whole(plan, outputs[0]))


def _usage(plan: _AcceptedChat, num_generated: int) -> dict:
    num_prompt = len(plan.prompt.ids)
    return {"prompt_tokens": num_prompt, "completion_tokens": num_generated, "total_tokens": num_prompt + num_generated}


def _whole(plan: _AcceptedChat, out) -> dict:
    logprobs = _Logprobs(plan.hosted, plan.prompt.ids)
    choices = sorted(out.outputs, key=lambda c: c.index)
    return {
        **plan.envelope("chat.completion"),
        "choices": [
            {"index": c.index, **_answer(plan, c.text, c.finish_reason),
             "logprobs": ({"content": logprobs.content(c.index, c.token_ids, c.logprobs, ends=True)}
                          if plan.logprobs else None)}
            for c in choices
        ],
        "usage": _usage(plan, sum(len(c.token_ids) for c in choices)),
    }


def _finish_reason(engine_reason: str | None, calls: list[ToolCall]) -> str | None:
    """An answer that ended by itself with calls ends for them; one cut short keeps "length"."""
    return "tool_calls" if calls and engine_reason == "stop" else engine_reason


def _answer(plan: _AcceptedChat, text: str, engine_reason: str | None) -> dict:
    """One choice's message and finish reason: its calls, and the text beside them as content."""
    if plan.tools.format is None:
        return {"message": {"role": ROLE, "content": text}, "finish_reason": engine_reason}
    content, calls = split_answer(plan.tools.format, text)
    if not calls:
        return {"message": {"role": ROLE, "content": content}, "finish_reason": engine_reason}
    message = {"role": ROLE, "content": content if content.strip() else None,
               "tool_calls": [call.to_openai() for call in calls]}
    return {"message": message, "finish_reason": _finish_reason(engine_reason, calls)}


def _call_delta(piece: CallDelta) -> dict:
    """OpenAI's streamed call: its index, id, type and name first (arguments ""), then its arguments' text."""
    if piece.id is None:
        return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.arguments}}]}
    return {"tool_calls": [{"index": piece.index, "id": piece.id, "type": "function",
                            "function": {"name": piece.name, "arguments": piece.arguments}}]}


def _error_event(error: APIError) -> bytes:
    # OpenAI's error object, plus TGI's error_type, which huggingface_hub reads from streamed errors.
    return sse_event({"error": {"message": error.message, "type": "internal_error", "param": None, "code": None},
                      "error_type": "generation"})


def _tail(plan: _AcceptedChat, num_generated: int) -> list[bytes]:
    """Usage in a chunk of its own when asked, then [DONE]."""
    usage = [sse_event({**plan.envelope("chat.completion.chunk"), "choices": [], "usage": _usage(plan, num_generated)})]
    return (usage if plan.include_usage else []) + [sse_event("[DONE]")]


async def _chunks(plan: _AcceptedChat, submitted: Submitted) -> AsyncIterator[bytes]:
    """A first chunk per choice with the role, then content deltas (with their logprobs), the finish
    reason with the last."""
    logprobs = _Logprobs(plan.hosted, plan.prompt.ids)

    def chunk(index: int, delta: dict, finish_reason: str | None = None, content_logprobs: list | None = None):
        choice = {"index": index, "delta": delta,
                  "logprobs": None if content_logprobs is None else {"content": content_logprobs},
                  "finish_reason": finish_reason}
        return sse_event({**plan.envelope("chat.completion.chunk"), "choices": [choice]})

    readers = {index: ToolCallStream(plan.tools.format) for index in range(plan.params.n)} if plan.tools.format else {}

    def deltas(index: int, text: str, engine_reason: str | None) -> tuple[list[dict], str | None]:
        """The deltas `text` makes (its content first, then any calls it completes) and the finish reason."""
        reader = readers.get(index)
        if reader is None:
            return [{"content": text}], engine_reason
        made = reader.push(text)
        if engine_reason is not None:
            made += reader.finish()
        calls = [_call_delta(piece) for piece in made.calls]
        shown = calls if calls and not made.content else [{"content": made.content}, *calls]
        return shown, _finish_reason(engine_reason, reader.calls)

    for index in range(plan.params.n):
        yield chunk(index, {"role": ROLE, "content": ""})
    async for out in submitted.outputs():
        for c in out.outputs:
            ends = c.finish_reason is not None
            entries = logprobs.content(c.index, c.token_ids, c.logprobs, ends) if plan.logprobs else None
            made, finish_reason = deltas(c.index, c.text, c.finish_reason)
            if made == [{"content": ""}] and not (c.finish_reason or entries):
                continue
            for i, delta in enumerate(made):  # logprobs with the first delta, the finish reason with the last
                last = i == len(made) - 1
                yield chunk(c.index, delta, finish_reason if last else None, entries if i == 0 else None)
