"""text-generation-inference /generate request bodies (pydantic: the HTTP edge only).

Field names, types and defaults are TGI's `GenerateParameters`; `num_beams`, `length_penalty`
and `early_stopping` are Quill's additions (TGI has no beam search). Unknown fields are ignored,
as TGI's serde does, so newer clients keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class GenerateParameters(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    max_new_tokens: int | None = None  # None: as much as the context leaves, capped
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None  # not supported: rejected when given
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    best_of: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool | None = None
    top_n_tokens: int | None = None
    truncate: int | None = None
    watermark: bool = False  # not supported: rejected when true
    grammar: Any = None  # not supported: rejected when given
    adapter_id: str | None = None  # not supported: rejected when given
    # Quill's extension: beam search
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False


class GenerateRequest(BaseModel):
    """POST /generate and /generate_stream."""

    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: str
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    model: str | None = None  # Quill's extension: which hosted model; None: the default one


class CompatGenerateRequest(GenerateRequest):
    """POST /: TGI's compatibility route, streamed or not as the body says."""

    stream: bool = False
