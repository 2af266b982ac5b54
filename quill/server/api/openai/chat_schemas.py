"""OpenAI /v1/chat/completions request, with vLLM's extensions (pydantic: the HTTP edge only).

The same body is TGI's Messages API (what huggingface_hub's InferenceClient.chat_completion sends).
Messages are parsed loosely here (any role, any content part) and checked in chat_prompt.py, so a
wrong role or an image part gets a message that says so rather than a schema error. A setting the
client leaves out is None: the checkpoint's recommendation or Quill's default fills it. A field not
declared here is refused (request_schema.py), in a message too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from quill.server.hosting import HostedModel
from quill.server.sampling import SamplingParams

from ..request_schema import RequestSchema
from .completion_schemas import OpenAISampling, StreamOptions


class ContentPart(BaseModel):
    # Loose, so an image or audio part parses and chat_prompt.py refuses it by its type; a text part's
    # keys beyond type and text are refused there as unknown fields.
    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None


class ChatMessage(RequestSchema):
    """The keys OpenAI's and vLLM's messages have; each one given reaches the template as it is, as in
    transformers (templates read tool_calls, tool_call_id, reasoning_content, ...). A client that sends
    back an answer's message whole sends refusal, annotations, audio and function_call too."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # vLLM's name for a reasoning model's thoughts; `reasoning`, its newer one
    reasoning: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None


class FunctionDefinition(RequestSchema):
    """OpenAI's function tool: `parameters` is a JSON schema of an object (none: it takes no arguments)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # OpenAI's exact-schema promise; calls are held to the schema only when forced


class Tool(RequestSchema):
    type: str
    function: FunctionDefinition


class ToolChoiceFunction(RequestSchema):
    name: str


class NamedToolChoice(RequestSchema):
    """`{"type": "function", "function": {"name": ...}}`: the answer is a call of that function."""

    type: str
    function: ToolChoiceFunction


class ChatTemplateOptions(RequestSchema):
    """vLLM's settings of how messages become the prompt."""

    messages: list[ChatMessage]
    add_generation_prompt: bool | None = None  # None: true, unless continue_final_message
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class ChatCompletionRequest(ChatTemplateOptions, OpenAISampling):
    model: str | None = None
    max_tokens: int | None = None  # None: what the context leaves, or the checkpoint's max_new_tokens
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # Accepted and ignored: they say who asks, how to bill, store or cache the request, never what to generate.
    user: str | None = None
    safety_identifier: str | None = None  # OpenAI's newer name for user
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None  # Quill caches every prompt's prefix unasked
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None  # None: "auto" with tools, "none" without
    # Accepted and ignored: a model may answer several calls whatever this says; the template shows the tools.
    parallel_tool_calls: bool | None = None
    tool_prompt: str | None = None  # TGI's Messages API: text put before the tools
    # Not supported: refused when given, never silently ignored.

    def to_sampling_params(self, hosted: HostedModel, max_tokens: int) -> SamplingParams:
        """Beam search answers all n beams."""
        return self.sampling_params(
            hosted, n=self.n, beam_width=self.n if self.use_beam_search else 1, max_tokens=max_tokens,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
        )
