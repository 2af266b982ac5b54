"""vLLM's /tokenize and /detokenize: a hosted model's tokenizer, for clients that count or inspect tokens.

/tokenize takes a prompt, or chat messages (then the ids are the prompt /v1/chat/completions would
generate after); errors are OpenAI-shaped, as vLLM answers them.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from quill.server.hosting import HostedModel

from ..errors import OPENAI_ERROR_RESPONSES
from ..generation import resolve_model
from ..validation import check_token_ids, invalid
from .chat_prompt import render_chat
from .chat_tools import checked_tools
from .tokenize_schemas import DetokenizeRequest, TokenizeChatRequest, TokenizeRequest

router = APIRouter()


def _tokens(hosted: HostedModel, ids: list[int], return_token_strs: bool) -> dict:
    return {"count": len(ids), "max_model_len": hosted.max_model_len, "tokens": ids,
            "token_strs": [hosted.tokenizer.id_to_token(i) for i in ids] if return_token_strs else None}


@router.post("/tokenize", responses=OPENAI_ERROR_RESPONSES)
async def tokenize(request: TokenizeRequest, http: Request):
    hosted = resolve_model(http, request.model)
    if isinstance(request, TokenizeChatRequest):
        tools = checked_tools(request.tools) or None
        ids = render_chat(hosted, request, add_special_tokens=request.add_special_tokens, tools=tools).ids
    else:
        try:
            request.prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid(f"the prompt is not valid Unicode ({e.reason} at position {e.start})", "prompt") from None
        ids = hosted.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
    return _tokens(hosted, ids, request.return_token_strs)


@router.post("/detokenize", responses=OPENAI_ERROR_RESPONSES)
async def detokenize(request: DetokenizeRequest, http: Request):
    hosted = resolve_model(http, request.model)
    check_token_ids(hosted, request.tokens, "tokens")
    return {"prompt": hosted.tokenizer.decode(request.tokens, skip_special_tokens=False)}
