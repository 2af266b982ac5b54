"""OpenAI /v1/completions request, with vLLM's extensions (pydantic: the HTTP edge only).

A setting the client leaves out is None here: the checkpoint's recommendation or Quill's default
fills it (server/api/sampling_defaults.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class VLLMExtensions(BaseModel):
    """vLLM's sampling settings beyond OpenAI's, shared by completions and chat."""

    model_config = ConfigDict(extra="ignore", strict=True)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    use_beam_search: bool = False  # completions: best_of is the beam width; chat: n is, and all n are answered
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    skip_special_tokens: bool = Field(default=True, description="drop special tokens from the text")


class CompletionRequest(VLLMExtensions):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = None  # None: 16, or the checkpoint's max_new_tokens
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = None
    echo: bool = False
    stop: str | list[str] | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    seed: int | None = None
