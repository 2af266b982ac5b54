"""vLLM's /tokenize and /detokenize request bodies (pydantic: the HTTP edge only)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import PlainValidator

from ..request_schema import RequestSchema
from .chat_schemas import ChatTemplateOptions, Tool


class TokenizeTextRequest(RequestSchema):
    """POST /tokenize with a prompt (vLLM)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(ChatTemplateOptions):
    """POST /tokenize with chat messages (vLLM): the prompt ids /v1/chat/completions would generate after."""

    model: str | None = None
    tools: list[Tool] | None = None  # shown to the model by its template, as in the chat request
    add_special_tokens: bool = False  # the template writes BOS itself
    return_token_strs: bool = False


def _tokenize_request(body: Any) -> TokenizeChatRequest | TokenizeTextRequest:
    """A body with messages is a chat body, any other a prompt body; read as that kind only, so an error
    names the body's own fields (tried as either, a prompt body would also fail as a chat body)."""
    chat = isinstance(body, dict) and "messages" in body
    return (TokenizeChatRequest if chat else TokenizeTextRequest).model_validate(body)


TokenizeRequest = Annotated[
    Union[TokenizeChatRequest, TokenizeTextRequest],
    PlainValidator(_tokenize_request, json_schema_input_type=Union[TokenizeChatRequest, TokenizeTextRequest]),
]


class DetokenizeRequest(RequestSchema):
    model: str | None = None
    tokens: list[int]
