"""Checks both dialects share, run before anything is submitted: the server's limits on a request, the
prompt against the model, and the sampling settings.

Each dialect parses its own fields and passes their names, so a message names what the client sent.
Rules that belong to one dialect (TGI's strictly positive top_k and u64 seeds, OpenAI's best_of >= n)
stay in its routes, except the forms OpenAI's two routes (completions and chat) both read: stop,
logit_bias, top_k.
"""

from __future__ import annotations

from quill.server.config import ServerConfig
from quill.server.hosting import HostedModel
from quill.server.sampling import SamplingParamError, SamplingParams
from quill.server.sampling.coverage import NEEDS_ATTENTION

from .errors import APIError
from .sampling_defaults import fill_sampling_settings


def invalid(message: str, param: str | None) -> APIError:
    return APIError(400, message, param=param, reason="invalid_request")


def check_max_tokens(config: ServerConfig, max_tokens: int, param: str) -> None:
    if not 1 <= max_tokens <= config.max_tokens_limit:
        raise invalid(f"{param} must be between 1 and {config.max_tokens_limit}, got {max_tokens}", param)


def check_num_samples(config: ServerConfig, num_samples: int, param: str) -> None:
    """Sequences sampled for one request (n, or best_of when some are dropped)."""
    if not 1 <= num_samples <= config.max_n:
        raise invalid(f"{param} must be between 1 and {config.max_n}, got {num_samples}", param)


def check_beam_width(config: ServerConfig, beam_width: int, param: str) -> None:
    if not 1 <= beam_width <= config.max_beam_width:
        raise invalid(f"{param} (the beam width) must be between 1 and {config.max_beam_width}, got {beam_width}",
                      param)


def check_sequences(config: ServerConfig, count: int, param: str, beam_search: bool) -> None:
    """n or best_of: a beam width under beam search, else how many sequences are sampled."""
    if beam_search:
        check_beam_width(config, count, param)
    else:
        check_num_samples(config, count, param)


def check_stop(config: ServerConfig, stop: list[str], param: str = "stop") -> None:
    """Stop strings are searched in every sequence at every step: their number and length are bounded."""
    if len(stop) > config.max_stop_strings:
        raise invalid(f"{param} must have at most {config.max_stop_strings} sequences, got {len(stop)}", param)
    if any(not s or len(s) > config.max_stop_string_chars for s in stop):
        raise invalid(f"{param} entries must have 1 to {config.max_stop_string_chars} characters", param)


def stop_list(stop: str | list[str] | None) -> list[str]:
    """OpenAI's `stop`: one string or a list."""
    return [stop] if isinstance(stop, str) else list(stop or [])


def stop_strings(config: ServerConfig, stop: str | list[str] | None, param: str = "stop") -> list[str]:
    """OpenAI's `stop`, checked against the server's bounds."""
    strings = stop_list(stop)
    check_stop(config, strings, param)
    return strings


def parse_logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's `logit_bias`: token ids written as JSON object keys (strings)."""
    if not logit_bias:
        return None
    try:
        return {int(k): v for k, v in logit_bias.items()}
    except ValueError:
        raise invalid("logit_bias keys must be token ids", "logit_bias") from None


def check_top_k(top_k: int | None) -> None:
    """vLLM's OpenAI routes: -1 turns top-k off; 0 is a mistake worth naming."""
    if top_k == 0:
        raise invalid("top_k must be -1 (off) or at least 1, got 0", "top_k")


def check_token_ids(hosted: HostedModel, ids: list[int], param: str) -> None:
    vocab = hosted.loaded.model.config.vocab_size
    if any(t < 0 or t >= vocab for t in ids):
        raise invalid(f"{param} must hold token ids in [0, {vocab})", param)


def encode_prompt(hosted: HostedModel, prompt: str | list[int], param: str = "prompt") -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("the prompt is empty", param)
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON can carry lone surrogates (\ud800); text cannot
            raise invalid(f"the prompt is not valid Unicode ({e.reason} at position {e.start})", param) from None
        try:
            ids = hosted.tokenizer.encode(prompt)
        except ValueError as e:  # a word-level vocabulary without an unknown-word token
            raise invalid(f"the prompt cannot be tokenized: {e}", param) from None
    else:
        ids = list(prompt)
        check_token_ids(hosted, ids, param)
    if not ids:
        raise invalid("the prompt is empty after tokenization", param)
    return ids


def encode_source(hosted: HostedModel, prompt: str | list[int], source_lang: str | None, target_lang: str | None,
                  param: str = "prompt") -> tuple[list[int], list[int]]:
    """An encoder-decoder model's prompt: (its source ids, the first output tokens its target language forces).
    Token ids are taken as the source as they are."""
    seq2seq = hosted.loaded.seq2seq
    try:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise invalid("the prompt is empty", param)
            ids = seq2seq.source_ids(prompt, source_lang, target_lang)
        else:
            ids = encode_prompt(hosted, prompt, param)
        return ids, seq2seq.target_prefix(target_lang)
    except ValueError as e:  # a language the model lacks, or one it needs and was not given
        raise invalid(str(e), "target_lang" if "target" in str(e) else "source_lang") from None


def target_prefix_ids(hosted: HostedModel, prefix: str | None, param: str = "target_prefix") -> list[int]:
    """The target-side ids of the text an encoder-decoder's answer must start with ([] for none)."""
    if not prefix:
        return []
    ids = hosted.tokenizer.encode(prefix, add_special_tokens=False)
    if not ids:
        raise invalid("the target prefix is empty after tokenization", param)
    check_token_ids(hosted, ids, param)
    return ids


def check_source(hosted: HostedModel, num_source_tokens: int, param: str = "prompt") -> None:
    """A source the encoder takes: no longer than its positions reach."""
    limit = hosted.loaded.model.config.max_source_len
    if num_source_tokens > limit:
        raise APIError(400, f"this model's encoder takes at most {limit} source tokens, but the prompt has "
                            f"{num_source_tokens}", param=param, code="context_length_exceeded",
                       reason="context_length")


def check_context(hosted: HostedModel, num_prompt_tokens: int, max_tokens: int, param: str = "max_tokens") -> None:
    """The prompt and the tokens to generate fit the model's context. An encoder-decoder model's prompt is its
    source, within the encoder's limit; its decoder holds its start token and the output."""
    if hosted.loaded.is_encoder_decoder:
        check_source(hosted, num_prompt_tokens)
        num_prompt_tokens = 1
    limit = hosted.max_model_len
    if num_prompt_tokens + max_tokens > limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens, but the request asks for "
            f"{num_prompt_tokens + max_tokens} ({num_prompt_tokens} in the prompt + {max_tokens} to generate)",
            param=param, code="context_length_exceeded", reason="context_length",
        )


def build_params(hosted: HostedModel, **kwargs) -> SamplingParams:
    """SamplingParams from the request's settings, None for each one it left out (filled by the checkpoint's
    recommendation or SamplingParams' default). SamplingParams checks itself; token ids it names must also
    exist in this model's vocabulary."""
    try:
        params = SamplingParams(**fill_sampling_settings(hosted, kwargs))
        params.check_vocab(hosted.loaded.model.config.vocab_size)
    except SamplingParamError as e:
        raise invalid(str(e), e.param) from None
    if params.follows_coverage and not getattr(hosted.loaded.model, "aligns", False):
        raise invalid(f"coverage_penalty {NEEDS_ATTENTION}; {hosted.name} has none", "coverage_penalty")
    return params
