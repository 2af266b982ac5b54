"""A request's chat messages -> the prompt's text and token ids, by the hosted model's chat template.

Shared by /v1/chat/completions and /tokenize, so both see the same prompt. Every problem (no
template, a wrong role, an empty list, a non-text part, a template that refuses the messages)
is a 400 naming what is wrong, raised before anything is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from quill.models.text.chat_template import ChatTemplateError
from quill.server.hosting import HostedModel

from ..errors import APIError, unrecognized
from ..validation import invalid
from .chat_schemas import ChatMessage, ChatTemplateOptions

ROLES = ("system", "developer", "user", "assistant", "tool")
RESERVED_TEMPLATE_KWARGS = ("messages", "add_generation_prompt")  # set by the request's own fields


@dataclass
class ChatPrompt:
    text: str
    ids: list[int]


def _template_message(i: int, message: ChatMessage) -> dict:
    """One message as the template reads it, or a 400 naming what is wrong with it."""
    if message.role not in ROLES:
        raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {message.role!r}",
                      f"messages.{i}.role")
    if message.content is None:
        if message.role == "assistant" and message.tool_calls:  # a turn that only called tools
            return message.model_dump(exclude_none=True)
        raise invalid(f"messages[{i}].content is missing: every message needs text", f"messages.{i}.content")
    if not isinstance(message.content, str):
        for j, part in enumerate(message.content):
            if part.type != "text" or part.text is None:
                raise invalid(f"messages[{i}].content[{j}] is a {part.type!r} part: only text parts are supported",
                              f"messages.{i}.content.{j}.type")
            if part.model_extra:  # a text part is its type and text; anything else would be dropped here
                raise unrecognized([f"messages.{i}.content.{j}.{key}" for key in part.model_extra])
    out = message.model_dump(exclude_none=True)
    if not isinstance(message.content, str):
        out["content"] = [{"type": "text", "text": part.text} for part in message.content]
    return out


def render_chat(hosted: HostedModel, options: ChatTemplateOptions, add_special_tokens: bool = False,
                tools: list[dict] | None = None) -> ChatPrompt:
    """The prompt `options.messages` make for `hosted`, tokenized as transformers does after a template:
    without special tokens (the template writes BOS itself) unless asked. `tools`: OpenAI's tool objects,
    which the template reads as `tools`."""
    template = hosted.template_for(tools is not None)
    if template is None:
        raise APIError(400, hosted.no_chat_reason, param="model", code="no_chat_template", reason="invalid_request")
    if not options.messages:
        raise invalid("messages must hold at least one message", "messages")
    messages = [_template_message(i, m) for i, m in enumerate(options.messages)]
    continue_final = options.continue_final_message
    add_generation_prompt = options.add_generation_prompt
    if add_generation_prompt is None:  # vLLM's default is true; continuing the last message implies false
        add_generation_prompt = not continue_final
    if add_generation_prompt and continue_final:
        raise invalid("add_generation_prompt and continue_final_message cannot both be true: the one opens a new "
                      "assistant message, the other continues the last one", "continue_final_message")
    kwargs = dict(options.chat_template_kwargs or {})
    for key in RESERVED_TEMPLATE_KWARGS:
        if key in kwargs:
            raise invalid(f"chat_template_kwargs cannot set {key!r}: it comes from the request", "chat_template_kwargs")
    if tools is not None:
        kwargs["tools"] = tools
    try:
        text = template.render(messages, add_generation_prompt, continue_final, **kwargs)
    except ChatTemplateError as e:
        raise invalid(str(e), "messages") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON can carry lone surrogates (\ud800); text cannot
        raise invalid(f"the messages are not valid Unicode ({e.reason} at position {e.start})", "messages") from None
    ids = hosted.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if not ids:
        raise invalid("the chat template made an empty prompt of these messages", "messages")
    return ChatPrompt(text, ids)
