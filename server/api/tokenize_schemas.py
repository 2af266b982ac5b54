"""vLLM's /tokenize and /detokenize request bodies (pydantic: the HTTP edge only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .chat_schemas import ChatTemplateOptions


class TokenizeTextRequest(BaseModel):
    """POST /tokenize with a prompt (vLLM)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(ChatTemplateOptions):
    """POST /tokenize with chat messages (vLLM): the prompt ids /v1/chat/completions would generate after."""

    model: str | None = None
    add_special_tokens: bool = False  # the template writes BOS itself
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    tokens: list[int]
