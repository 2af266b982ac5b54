"""text-generation-inference routes: /generate, /generate_stream, / (TGI's compatibility route) and /info.

TGI's semantics where Quill can offer them: greedy unless sampling is asked for (do_sample, or any
of temperature/top_k/top_p), a random seed chosen and reported when sampling, the stop sequence kept
in the text, each token's text shown with special tokens (flagged `special`) while generated_text
skips them, and the answer to `/` wrapped in a list as api-inference does.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request

from quill.models.text.tokenizer import IncrementalDecoder
from quill.server import __version__
from quill.server.config import ServerConfig
from quill.server.engine import CompletionOutput, TokenLogprob
from quill.server.hosting import HostedModel
from quill.server.sampling import SamplingParams
from quill.server.sampling.params import MAX_LOGPROBS

from ..errors import JSON_OR_SSE_RESPONSE, SSE_RESPONSE, TGI_ERROR_RESPONSES, APIError
from ..generation import Submitted, answer, event_stream, loaded_host, resolve_model, start
from ..sampling_defaults import default_max_tokens
from ..sse import sse_event
from ..structured_fields import check_constraint
from ..validation import (
    check_beam_width,
    check_context,
    check_max_tokens,
    check_num_samples,
    check_stop,
    encode_prompt,
    encode_source,
    invalid,
)
from .schemas import CompatGenerateRequest, GenerateParameters, GenerateRequest

router = APIRouter()

DEFAULT_MAX_NEW_TOKENS = 1024  # TGI's cap when a request names no max_new_tokens (then: what the context leaves)
SEED_MAX = 2**64 - 1  # TGI's seeds are u64
SEED_BITS = 63  # seeds the server picks stay clear of SEED_MAX: output i is seeded with seed + i


@dataclass
class _AcceptedGenerate:
    """A request that passed every check: what to submit, and how to answer it."""

    hosted: HostedModel
    inputs: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int | None  # when sampling; output i used seed + i
    details: bool
    decoder_input_details: bool
    top_n_tokens: int
    return_full_text: bool


def _mean_logprob(c: CompletionOutput) -> float:
    return c.cumulative_logprob / max(len(c.token_ids), 1)


def _check_supported(p: GenerateParameters) -> None:
    unsupported = {"typical_p": p.typical_p is not None, "watermark": p.watermark,
                   "adapter_id": p.adapter_id is not None}
    for name, given in unsupported.items():
        if given:
            raise invalid(f"{name} is not supported by this server; leave it out", name)


def _check_ranges(p: GenerateParameters, config: ServerConfig, stream: bool) -> None:
    """TGI's own rules first (top_p < 1, temperature > 0, u64 seeds, ...), then the server's limits."""
    if p.temperature is not None and not p.temperature > 0:
        raise invalid(f"temperature must be strictly positive, got {p.temperature}", "temperature")
    if p.top_k is not None and p.top_k <= 0:
        raise invalid(f"top_k must be strictly positive, got {p.top_k}", "top_k")
    if p.top_p is not None and not 0 < p.top_p < 1:
        raise invalid(f"top_p must be > 0.0 and < 1.0, got {p.top_p}", "top_p")
    if p.seed is not None and not 0 <= p.seed <= SEED_MAX:
        raise invalid(f"seed must be between 0 and {SEED_MAX}, got {p.seed}", "seed")
    if p.top_n_tokens is not None and not 0 <= p.top_n_tokens <= MAX_LOGPROBS:
        raise invalid(f"top_n_tokens must be between 0 and {MAX_LOGPROBS}, got {p.top_n_tokens}", "top_n_tokens")
    if stream and p.decoder_input_details:
        raise invalid("decoder_input_details == true is not supported when streaming tokens", "decoder_input_details")
    if p.max_new_tokens is not None:
        check_max_tokens(config, p.max_new_tokens, "max_new_tokens")
    check_stop(config, p.stop)
    check_beam_width(config, p.num_beams, "num_beams")


def _check_best_of(p: GenerateParameters, config: ServerConfig, stream: bool) -> None:
    best_of = p.num_sequences
    check_num_samples(config, best_of, "best_of")
    if best_of > 1:
        if not p.is_sampling:
            raise invalid("best_of > 1 needs sampling: set do_sample, temperature, top_k or top_p", "best_of")
        if p.seed is not None:
            raise invalid("seed cannot be set when best_of > 1", "seed")
        if stream:
            raise invalid("best_of != 1 is not supported when streaming tokens", "best_of")


def _check_beams(p: GenerateParameters) -> None:
    """Beam search is Quill's addition; it ranks raw log-probabilities and knows no stop strings."""
    if p.num_beams == 1:
        if p.length_penalty != 1.0 or p.early_stopping is not False or p.coverage_penalty != 0.0:
            raise invalid("length_penalty, early_stopping and coverage_penalty need beam search (num_beams > 1)",
                          "num_beams")
        return
    clashes = {"do_sample/temperature/top_k/top_p": p.is_sampling, "best_of": p.num_sequences > 1,
               "stop": bool(p.stop), "top_n_tokens": bool(p.top_n_tokens),
               "repetition_penalty": p.repetition_penalty not in (None, 1.0),
               "frequency_penalty": p.frequency_penalty not in (None, 0.0)}
    for name, clash in clashes.items():
        if clash:
            raise invalid(f"{name} cannot be combined with beam search (num_beams > 1)", name.split("/")[0])


def _validate(request: GenerateRequest, config: ServerConfig, hosted: HostedModel, stream: bool) -> _AcceptedGenerate:
    """Everything checked before anything is submitted (and so before the first byte of a stream)."""
    p = request.parameters
    _check_supported(p)
    if not request.inputs:
        raise invalid("inputs cannot be empty", "inputs")
    _check_ranges(p, config, stream)
    _check_best_of(p, config, stream)
    _check_beams(p)
    if hosted.loaded.is_encoder_decoder:  # the inputs are the encoder's source
        if p.decoder_input_details:
            raise invalid("decoder_input_details is not supported by encoder-decoder models", "decoder_input_details")
        prompt_ids = encode_source(hosted, request.inputs, None, None, param="inputs")[0]
    else:
        prompt_ids = encode_prompt(hosted, request.inputs, param="inputs")
    if p.truncate is not None:
        if not 1 <= p.truncate <= hosted.max_model_len:
            raise invalid(f"truncate must be between 1 and {hosted.max_model_len}, got {p.truncate}", "truncate")
        prompt_ids = prompt_ids[-p.truncate:]  # TGI keeps the end of the prompt
    max_new_tokens = p.max_new_tokens
    if max_new_tokens is None:
        decoder_prompt = 1 if hosted.loaded.is_encoder_decoder else len(prompt_ids)
        max_new_tokens = min(default_max_tokens(hosted, config, decoder_prompt), DEFAULT_MAX_NEW_TOKENS)
    check_context(hosted, len(prompt_ids), max_new_tokens, param="max_new_tokens")
    seed = None
    if p.is_sampling:
        seed = p.seed if p.seed is not None else random.getrandbits(SEED_BITS)
    params = p.to_sampling_params(hosted, max_new_tokens, seed, stream)
    return _AcceptedGenerate(hosted, request.inputs, prompt_ids, params, seed, p.details or p.decoder_input_details,
                 p.decoder_input_details, p.top_n_tokens or 0, bool(p.return_full_text))


async def _start(request: GenerateRequest, http: Request, stream: bool) -> tuple[_AcceptedGenerate, list[Submitted]]:
    hosted = resolve_model(http, request.model)
    plan = _validate(request, http.app.state.config, hosted, stream)
    await check_constraint(hosted, plan.params.structured, "grammar")
    return plan, start(http, hosted, [(plan.prompt_ids, request.inputs)], plan.params, [f"tgi-{uuid.uuid4().hex}"])


class _Tokens:
    """TGI's token objects, texts and finish reasons for one request's tokenizer and prompt."""

    def __init__(self, hosted: HostedModel, prompt_ids: list[int]):
        self.tokenizer = hosted.tokenizer
        self.prompt_ids = prompt_ids
        self.eos_token_ids = frozenset(hosted.loaded.eos_token_ids)
        added = self.tokenizer.hf.get_added_tokens_decoder()
        self.special_ids = self.eos_token_ids | {i for i, t in added.items() if t.special}

    def decoder(self) -> IncrementalDecoder:
        """One per sequence: TGI shows special tokens in token texts (and flags them `special`)."""
        return IncrementalDecoder(self.tokenizer, self.prompt_ids, skip_special_tokens=False)

    def generated(self, decoder: IncrementalDecoder, token_id: int, logprob: float | None, is_last: bool) -> dict:
        """The next token of a sequence: its text continues the previous tokens' (a split UTF-8 character
        is held back until completed, or flushed with the last token). A special token's text then starts with
        the U+FFFD it ends, which generated_text shows too."""
        text = decoder.push(token_id) + (decoder.flush() if is_last else "")
        return {"id": token_id, "text": text, "logprob": logprob, "special": token_id in self.special_ids}

    def alone(self, token_id: int, logprob: float | None) -> dict:
        """A prompt token or an alternative: its own text."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"id": token_id, "text": text, "logprob": logprob, "special": token_id in self.special_ids}

    def top(self, entry: TokenLogprob | None) -> list[dict]:
        return [self.alone(t, lp) for t, lp in entry.top] if entry is not None else []

    def text(self, token_ids: list[int]) -> str:
        """generated_text: what the tokens add to the prompt's text, special tokens skipped."""
        return self.tokenizer.decode_continuation(self.prompt_ids, token_ids, skip_special_tokens=True)

    def finish_reason(self, engine_reason: str | None, token_ids: list[int]) -> str:
        """Engine "stop" is EOS or a stop sequence; TGI tells them apart."""
        if engine_reason == "length":
            return "length"
        if engine_reason == "stop":
            return "eos_token" if token_ids and token_ids[-1] in self.eos_token_ids else "stop_sequence"
        raise APIError(500, f"generation ended early ({engine_reason or 'no finish reason'})", reason="engine_error")


def _padded(entries: list[TokenLogprob] | None, length: int) -> list[TokenLogprob | None]:
    """Logprob entries for `length` tokens; beam search reports none."""
    entries = list(entries or [])
    return entries + [None] * (length - len(entries))


# ---- /generate -------------------------------------------------------------------------------


@router.post("/generate", responses=TGI_ERROR_RESPONSES)
async def generate(request: GenerateRequest, http: Request):
    plan, submitted = await _start(request, http, stream=False)
    return await answer(http, submitted, lambda outputs: _whole(plan, outputs[0]))


def _whole(plan: _AcceptedGenerate, out) -> dict:
    # TGI's best_of: the highest mean log-probability per token wins; the others go to best_of_sequences.
    best, *others = sorted(out.outputs, key=_mean_logprob, reverse=True)
    prefix = plan.inputs if plan.return_full_text else ""
    tokens = _Tokens(plan.hosted, plan.prompt_ids)
    body = {"generated_text": prefix + tokens.text(best.token_ids)}
    if plan.details:
        prefill = _prefill(plan, tokens, out.prompt_logprobs)
        details = _details(plan, tokens, best, prefill)
        if plan.params.n > 1:
            details["best_of_sequences"] = [
                {"generated_text": prefix + tokens.text(s.token_ids), **_details(plan, tokens, s, prefill)}
                for s in others
            ]
        body["details"] = details
    return body


def _prefill(plan: _AcceptedGenerate, tokens: _Tokens, entries: list[TokenLogprob | None] | None) -> list[dict]:
    if not plan.decoder_input_details:
        return []
    prefill = []
    for token_id, entry in zip(plan.prompt_ids, _padded(entries, len(plan.prompt_ids))):
        token = tokens.alone(token_id, None if entry is None else entry.logprob)
        del token["special"]  # TGI's PrefillToken has no such field
        prefill.append(token)
    return prefill


def _details(plan: _AcceptedGenerate, tokens: _Tokens, seq: CompletionOutput, prefill: list[dict]) -> dict:
    decoder = tokens.decoder()
    entries = _padded(seq.logprobs, len(seq.token_ids))
    last = len(seq.token_ids) - 1
    details = {
        "finish_reason": tokens.finish_reason(seq.finish_reason, seq.token_ids),
        "generated_tokens": len(seq.token_ids),
        "seed": None if plan.seed is None else plan.seed + seq.index,
        "prefill": prefill,
        "tokens": [tokens.generated(decoder, t, None if e is None else e.logprob, i == last)
                   for i, (t, e) in enumerate(zip(seq.token_ids, entries))],
    }
    if plan.top_n_tokens:
        details["top_tokens"] = [tokens.top(e) for e in entries]
    return details


# ---- /generate_stream ------------------------------------------------------------------------


@router.post("/generate_stream", responses={**TGI_ERROR_RESPONSES, **SSE_RESPONSE})
async def generate_stream(request: GenerateRequest, http: Request):
    plan, submitted = await _start(request, http, stream=True)
    return event_stream(submitted, lambda _, s: _events(plan, s), _error_event)


def _error_event(error: APIError) -> bytes:
    error_type = "incomplete_generation" if error.reason == "incomplete_generation" else "generation"
    return sse_event({"error": error.message, "error_type": error_type})


async def _events(plan: _AcceptedGenerate, submitted: Submitted) -> AsyncIterator[bytes]:
    """One event per token; the last token's event carries generated_text (and details when asked)."""
    tokens = _Tokens(plan.hosted, plan.prompt_ids)
    decoder = tokens.decoder()
    token_ids: list[int] = []
    finished = False
    async for out in submitted.outputs():
        events = []  # TGI's protocol has an event per token; the tokens of one output go out in one write
        for c in out.outputs:  # streaming allows no best_of, so this is the one sequence
            for i, (token_id, entry) in enumerate(zip(c.token_ids, _padded(c.logprobs, len(c.token_ids)))):
                is_last = c.finish_reason is not None and i == len(c.token_ids) - 1
                token_ids.append(token_id)
                event = {"index": len(token_ids),
                         "token": tokens.generated(decoder, token_id, None if entry is None else entry.logprob,
                                                   is_last),
                         "top_tokens": tokens.top(entry) if plan.top_n_tokens else [],
                         "generated_text": None, "details": None}
                if is_last:
                    event |= _final(plan, tokens, c.finish_reason, token_ids)
                    finished = True
                events.append(sse_event(event))
            if c.finish_reason is not None and not finished:
                yield b"".join(events)
                raise APIError(500, f"generation ended early ({c.finish_reason})", reason="engine_error")
        if events:
            yield b"".join(events)
    if not finished:
        raise APIError(500, "incomplete generation stream", reason="incomplete_generation")


def _final(plan: _AcceptedGenerate, tokens: _Tokens, engine_reason: str, token_ids: list[int]) -> dict:
    """What the last token's event adds: the whole text, and TGI's StreamDetails when asked."""
    final = {"generated_text": (plan.inputs if plan.return_full_text else "") + tokens.text(token_ids)}
    if plan.details:
        final["details"] = {"finish_reason": tokens.finish_reason(engine_reason, token_ids),
                            "generated_tokens": len(token_ids), "seed": plan.seed,
                            "input_length": len(plan.prompt_ids)}
    return final


# ---- / ---------------------------------------------------------------------------------------


@router.post("/", responses={**TGI_ERROR_RESPONSES, **JSON_OR_SSE_RESPONSE})
async def compat_generate(request: CompatGenerateRequest, http: Request):
    """TGI's compatibility route: streams when the body says so; otherwise a one-element list, as
    api-inference answers (huggingface_hub's InferenceClient takes either shape)."""
    if request.stream:
        return await generate_stream(request, http)
    return [await generate(request, http)]


# ---- /info -----------------------------------------------------------------------------------


@router.get("/info", responses={401: TGI_ERROR_RESPONSES[401], 503: TGI_ERROR_RESPONSES[503]})
async def info(http: Request):
    """TGI's Info (what InferenceClient.get_endpoint_info() returns), for the default model: TGI serves
    one. Older TGI names (max_input_length, model_dtype, ...) are given too, as clients read either."""
    hosted = loaded_host(http).get(None)
    config: ServerConfig = http.app.state.config
    loaded = hosted.loaded
    return {
        "model_id": loaded.model_id, "model_sha": loaded.revision, "model_pipeline_tag": "text-generation",
        "model_dtype": str(loaded.dtype), "model_device_type": loaded.device.type,
        "max_concurrent_requests": config.max_num_seqs + config.max_queue,
        "max_best_of": config.max_n, "max_stop_sequences": config.max_stop_strings,
        "max_input_tokens": hosted.max_model_len - 1, "max_input_length": hosted.max_model_len - 1,
        "max_total_tokens": hosted.max_model_len, "max_batch_total_tokens": config.max_num_batched_tokens,
        "max_batch_size": config.max_num_seqs, "max_client_batch_size": 1, "validation_workers": 1,
        "router": "quill", "version": __version__, "sha": None, "docker_label": None,
    }
