"""OpenAI /v1/chat/completions request, with vLLM's extensions (pydantic: the HTTP edge only).

The same body is TGI's Messages API (what huggingface_hub's InferenceClient.chat_completion sends).
Messages are parsed loosely here (any role, any content part) and checked in chat_prompt.py, so a
wrong role or an image part gets a message that says so rather than a schema error. A setting the
client leaves out is None: the checkpoint's recommendation or Quill's default fills it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from server.hosting import HostedModel
from server.sampling import SamplingParams

from .openai_schemas import OpenAISampling, StreamOptions


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    # Extra keys (tool_call_id, reasoning_content, ...) reach the template as they are, as in transformers.
    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatTemplateOptions(BaseModel):
    """vLLM's settings of how messages become the prompt."""

    model_config = ConfigDict(extra="ignore", strict=True)

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
    user: str | None = None
    # Not supported: refused when given, never silently ignored.
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def to_sampling_params(self, hosted: HostedModel, max_tokens: int) -> SamplingParams:
        """Beam search answers all n beams."""
        return self.sampling_params(
            hosted, n=self.n, beam_width=self.n if self.use_beam_search else 1, max_tokens=max_tokens,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
        )
