"""POST /v1/structured/allowed: what a constraint lets come next after some output, for the playground's
token tips: which of the alternatives the model offered the grammar allowed, and how many tokens in all.

The output so far is given as text and spelled in the model's tokens greedily: the grammar reads bytes, so
any spelling of the same text reaches the same place in it.
"""

from __future__ import annotations

import torch
from fastapi import APIRouter, Request

from quill.server.structured.matcher import bitmask_words

from .errors import OPENAI_ERROR_RESPONSES
from .generation import resolve_model
from .request_schema import RequestSchema
from .structured_fields import StructuredOutputsField, check_constraint, from_structured_outputs
from .validation import invalid

router = APIRouter()


class AllowedRequest(RequestSchema):
    model: str | None = None
    structured_outputs: StructuredOutputsField
    text: str  # the output before the position asked about
    alternatives: list[str] = []  # token texts to check at that position


@router.post("/v1/structured/allowed", responses=OPENAI_ERROR_RESPONSES)
async def allowed_next(request: AllowedRequest, http: Request):
    hosted = resolve_model(http, request.model)
    found = from_structured_outputs(request.structured_outputs)
    if not found:
        raise invalid("structured_outputs names no constraint", "structured_outputs")
    await check_constraint(hosted, found[0], "structured_outputs")
    grammars = hosted.grammars
    matcher = grammars.compile(found[0]).deep_copy()
    tokenizer = grammars.tokenizer
    follows = matcher.consume_tokens(tokenizer.greedy_tokenize(request.text))
    if not follows:
        return {"text_follows": False, "allowed": [False] * len(request.alternatives), "num_allowed": 0,
                "vocab_size": grammars.vocab_size}
    allowed = []
    for alternative in request.alternatives:
        ids = tokenizer.greedy_tokenize(alternative)
        allowed.append(bool(ids) and matcher.validate_tokens(ids) == len(ids))
    mask = torch.zeros(bitmask_words(grammars.vocab_size), dtype=torch.int32)
    matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
    num_allowed = int(((mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).sum())
    return {"text_follows": True, "allowed": allowed, "num_allowed": num_allowed, "vocab_size": grammars.vocab_size}
