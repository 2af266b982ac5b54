"""OpenAI-compatible routes: /v1/completions (plain and streamed) and /v1/models (chat: chat.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from quill.server.engine import TokenLogprob

from ..errors import JSON_OR_SSE_RESPONSE, OPENAI_ERROR_RESPONSES, APIError
from ..generation import answer, event_stream, loaded_host, resolve_model, start
from ..sampling_defaults import default_max_tokens
from ..sse import sse_event
from ..structured_fields import check_constraint
from ..token_texts import TokenTexts
from ..validation import (check_context, check_max_tokens, check_sequences, encode_prompt, encode_source, invalid,
                          target_prefix_ids)
from .completion_schemas import CompletionRequest

router = APIRouter()

DEFAULT_MAX_TOKENS = 16  # OpenAI's, for a completion that names no max_tokens (and a checkpoint that recommends none)


def _prompts(request: CompletionRequest) -> list:
    p = request.prompt
    if isinstance(p, str) or (p and isinstance(p[0], int)):
        return [p]
    if not p:
        raise invalid("the prompt is empty", "prompt")
    return list(p)


def _validate(request: CompletionRequest, config, hosted) -> tuple:
    """Everything checked before the first byte: OpenAI's own rules, the server's limits, sampling settings,
    the prompts' lengths."""
    if request.suffix:
        raise invalid("suffix is not supported", "suffix")
    if request.max_tokens is not None:
        check_max_tokens(config, request.max_tokens, "max_tokens")
    best_of = request.num_sequences
    if request.n < 1 or best_of < request.n:
        raise invalid(f"n must be >= 1 and best_of >= n, got n={request.n}, best_of={best_of}", "n")
    check_sequences(config, best_of, "best_of", request.use_beam_search)
    if request.stream and best_of > request.n and not request.use_beam_search:
        raise invalid("best_of > n cannot be streamed", "best_of")
    if request.use_beam_search and request.stop:
        raise invalid("stop strings are not supported with beam search", "stop")
    request.check_forms(config)
    seq2seq = hosted.loaded.seq2seq
    if seq2seq is None and (request.source_lang or request.target_lang or request.target_prefix):
        raise invalid("source_lang, target_lang and target_prefix are for encoder-decoder (translation) models",
                      "target_prefix" if request.target_prefix else "target_lang")
    if seq2seq is not None and request.echo:
        raise invalid("echo is not supported by encoder-decoder models: the prompt is the encoder's source", "echo")
    prompts, forced = [], []
    for prompt in _prompts(request):
        if seq2seq is not None:  # the source's ids are not the (target) tokenizer's to decode: logged as ids
            ids, forced = encode_source(hosted, prompt, request.source_lang, request.target_lang)
            forced = forced + target_prefix_ids(hosted, request.target_prefix)
            text = prompt if isinstance(prompt, str) else str(ids)
        else:
            ids = encode_prompt(hosted, prompt)
            text = prompt if isinstance(prompt, str) else hosted.tokenizer.decode(ids, request.skip_special_tokens)
        prompts.append((ids, text))
    max_tokens = request.max_tokens
    if max_tokens is None:
        longest = 1 if seq2seq is not None else max(len(ids) for ids, _ in prompts)
        max_tokens = default_max_tokens(hosted, config, longest, DEFAULT_MAX_TOKENS)
    params = request.to_sampling_params(hosted, max_tokens, forced)
    for ids, _ in prompts:  # after the settings: a bad setting is named even when the context is also short
        check_context(hosted, len(ids), max_tokens)
    return params, prompts


def _logprobs_block(texts: TokenTexts, entries: list[TokenLogprob | None], ids: list[int], offset: int,
                    ends: bool) -> dict:
    """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset. `texts` has
    seen the tokens before `ids`; `ends`: the last of `ids` ends the sequence."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for i, (token_id, entry) in enumerate(zip(ids, entries)):
        text, top = texts.next(token_id, entry, is_last=ends and i == len(ids) - 1)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        token_logprobs.append(None if entry is None else entry.logprob)
        tops.append(None if entry is None else {alt_text: lp for _, alt_text, lp in top})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


@router.get("/v1/models", responses={401: OPENAI_ERROR_RESPONSES[401], 503: OPENAI_ERROR_RESPONSES[503]})
async def list_models(http: Request):
    """The hosted models; 503 while they load (no partial list: a client that waits for this route waits
    until every model can serve)."""
    host = loaded_host(http)
    # root: what the model was loaded from (vLLM's field); chat: Quill's, whether /v1/chat/completions serves it.
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": m.created, "owned_by": "quill", "root": m.loaded.model_id,
         "parent": None, "max_model_len": m.max_model_len, "architecture": m.loaded.architecture,
         "chat": m.chat_template is not None, "encoder_decoder": m.loaded.is_encoder_decoder,
         **({"languages": m.loaded.seq2seq.languages, "max_source_len": m.loaded.model.config.max_source_len}
            if m.loaded.is_encoder_decoder else {})}
        for name, m in host.models.items()
    ]}


@router.post("/v1/completions", responses={**OPENAI_ERROR_RESPONSES, **JSON_OR_SSE_RESPONSE})
async def create_completion(request: CompletionRequest, http: Request):
    hosted = resolve_model(http, request.model)
    params, prompts = _validate(request, http.app.state.config, hosted)
    await check_constraint(hosted, params.structured, request.structured_output()[1])
    completion = _Completion(request, hosted, params, prompts, f"cmpl-{uuid.uuid4().hex}", int(time.time()))
    submitted = start(http, hosted, prompts, params, [f"{completion.id}-{i}" for i in range(len(prompts))])
    if request.stream:
        return event_stream(submitted, completion.events, _error_event, lambda: completion.tail(submitted))
    return await answer(http, submitted, completion.whole)


class _Completion:
    """One /v1/completions answer: whole, or as the chunks of a stream."""

    def __init__(self, request: CompletionRequest, hosted, params, prompts: list[tuple[list[int], str]],
                 completion_id: str, created: int):
        self.request, self.hosted, self.params, self.prompts = request, hosted, params, prompts
        self.id, self.created = completion_id, created

    def envelope(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.hosted.name}

    def whole(self, outputs: list) -> dict:
        request, tokenizer = self.request, self.hosted.tokenizer
        choices, usage_prompt, usage_completion = [], 0, 0
        for p, ((ids, text), out) in enumerate(zip(self.prompts, outputs)):
            usage_prompt += len(ids)
            outs = sorted(out.outputs, key=lambda c: c.index)
            usage_completion += sum(len(c.token_ids) for c in outs)
            if not self.params.use_beam_search and len(outs) > request.n:  # best_of: keep the n most likely
                outs = sorted(outs, key=lambda c: c.score if c.score is not None else c.cumulative_logprob,
                              reverse=True)[: request.n]
            for i, c in enumerate(outs):
                logprobs = None
                if request.logprobs is not None:
                    entries = c.logprobs or []
                    token_ids, context = c.token_ids[: len(entries)], ids
                    if request.echo:
                        entries, token_ids = (out.prompt_logprobs or [None] * len(ids)) + entries, ids + token_ids
                        context = ()
                    logprobs = _logprobs_block(TokenTexts(tokenizer, context), entries, token_ids, 0, ends=True)
                choices.append({"index": p * request.n + i, "text": (text if request.echo else "") + c.text,
                                "logprobs": logprobs, "finish_reason": c.finish_reason})
        return {**self.envelope(), "choices": choices, "usage": _usage(usage_prompt, usage_completion)}

    async def events(self, p: int, submitted) -> AsyncIterator[bytes]:
        """The chunks of prompt `p`'s choices: text deltas, logprobs, the finish reason with the last."""
        request, tokenizer = self.request, self.hosted.tokenizer
        ids, text = self.prompts[p]
        echoed: set[int] = set()
        offsets: dict[int, int] = {}
        texts: dict[int, TokenTexts] = {}  # per choice: its tokens' texts so far
        async for out in submitted.outputs():
            for c in out.outputs:
                index = p * request.n + c.index
                prefix = ""
                if request.echo and index not in echoed:
                    echoed.add(index)
                    prefix = text
                logprobs = None
                if request.logprobs is not None and c.token_ids:
                    sequence = texts.setdefault(index, TokenTexts(tokenizer, ids))
                    logprobs = _logprobs_block(sequence, c.logprobs or [], c.token_ids, offsets.get(index, 0),
                                               ends=c.finish_reason is not None)
                    offsets[index] = offsets.get(index, 0) + sum(len(t) for t in logprobs["tokens"])
                if prefix or c.text or c.finish_reason or logprobs:
                    choice = {"index": index, "text": prefix + c.text, "logprobs": logprobs,
                              "finish_reason": c.finish_reason}
                    yield sse_event({**self.envelope(), "choices": [choice]})

    def tail(self, submitted: list) -> list[bytes]:
        """The usage chunk when asked, then [DONE]."""
        chunks = []
        if self.request.stream_options and self.request.stream_options.include_usage:
            prompt_tokens = sum(len(ids) for ids, _ in self.prompts)
            generated = sum(s.tracker.num_generated for s in submitted)
            chunks.append(sse_event({**self.envelope(), "choices": [], "usage": _usage(prompt_tokens, generated)}))
        return chunks + [sse_event("[DONE]")]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _error_event(error: APIError) -> bytes:
    return sse_event({"error": {"message": error.message, "type": "internal_error", "param": None, "code": None}})
