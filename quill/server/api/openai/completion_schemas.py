"""OpenAI /v1/completions request, with vLLM's extensions (pydantic: the HTTP edge only), and the
sampling settings it shares with chat, mapped to SamplingParams once for both.

A setting the client leaves out is None here: the checkpoint's recommendation or Quill's default
fills it (quill/server/api/sampling_defaults.py). A field not declared here is refused (request_schema.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quill.server.config import ServerConfig
from quill.server.hosting import HostedModel
from quill.server.sampling import SamplingParams

from ..request_schema import RequestSchema
from ..structured_fields import GuidedFields
from ..bad_words import bad_words_token_ids
from ..validation import build_params, check_stop, check_top_k, parse_logit_bias, stop_list, stop_strings


class StreamOptions(RequestSchema):
    include_usage: bool = False
    # Accepted and ignored: OpenAI pads streamed chunks against length side channels unless this is false;
    # Quill adds no padding, and padding never changes the text.
    include_obfuscation: bool | None = None


class VLLMExtensions(GuidedFields):
    """vLLM's sampling settings beyond OpenAI's, shared by completions and chat (constraints: GuidedFields)."""

    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    use_beam_search: bool = False  # completions: best_of is the beam width; chat: n is, and all n are answered
    length_penalty: float = 1.0
    length_penalty_type: Literal["power", "wu"] = "power"  # "wu": OpenNMT's (Wu et al. 2016)
    early_stopping: bool | Literal["never"] = False
    coverage_penalty: float = 0.0  # OpenNMT's -beta, for an encoder-decoder's beams (sampling/coverage.py)
    coverage_penalty_type: Literal["wu", "summary"] = "wu"
    coverage_penalty_stepwise: bool = False
    no_repeat_ngram_size: int = 0  # transformers' rule: never repeat an n-gram of this size (0: off)
    bad_words: list[str] | None = None  # never generated (bad_words.py)
    skip_special_tokens: bool = Field(default=True, description="drop special tokens from the text")


class OpenAISampling(VLLMExtensions):
    """The settings completions and chat read alike, their checks and their mapping to SamplingParams;
    each route adds how many sequences, how wide a beam and which log-probabilities."""

    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None

    def check_forms(self, config: ServerConfig) -> None:
        """The forms only OpenAI's routes take (top_k -1, stop as one string, logit_bias keys as strings),
        checked before the prompt is read."""
        check_top_k(self.top_k)
        stop_strings(config, self.stop)
        check_stop(config, self.bad_words or [], "bad_words")  # searched at every step, as stop strings are
        parse_logit_bias(self.logit_bias)

    def sampling_params(self, hosted: HostedModel, *, n: int, beam_width: int, max_tokens: int,
                        logprobs: int | None, prompt_logprobs: int | None = None,
                        forced_token_ids: list[int] | None = None) -> SamplingParams:
        return build_params(
            hosted, n=n, max_tokens=max_tokens, min_tokens=self.min_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=parse_logit_bias(self.logit_bias), seed=self.seed, stop=stop_list(self.stop),
            stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            use_beam_search=self.use_beam_search, beam_width=beam_width,
            length_penalty=self.length_penalty, length_penalty_type=self.length_penalty_type,
            early_stopping=self.early_stopping,
            coverage_penalty=self.coverage_penalty, coverage_penalty_type=self.coverage_penalty_type,
            coverage_penalty_stepwise=self.coverage_penalty_stepwise,
            skip_special_tokens=self.skip_special_tokens, structured=self.structured_output()[0],
            no_repeat_ngram_size=self.no_repeat_ngram_size, forced_token_ids=forced_token_ids or [],
            bad_words_token_ids=bad_words_token_ids(hosted.loaded.tokenizer, self.bad_words) if self.bad_words else [],
        )


class CompletionRequest(OpenAISampling):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = None  # None: 16, or the checkpoint's max_new_tokens
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = None
    echo: bool = False
    user: str | None = None  # accepted and ignored: who asks (OpenAI's abuse monitoring), not what to generate
    # Quill's extension, for encoder-decoder (translation) models: the prompt's language and the answer's
    source_lang: str | None = None
    target_lang: str | None = None
    target_prefix: str | None = None  # text every answer starts with (its tokens forced, then generation goes on)

    @property
    def num_sequences(self) -> int:
        """best_of: sampled sequences of which the n most likely are answered; with beam search, the beam width."""
        return self.best_of if self.best_of is not None else self.n

    def to_sampling_params(self, hosted: HostedModel, max_tokens: int,
                           forced_token_ids: list[int] | None = None) -> SamplingParams:
        beam = self.use_beam_search
        return self.sampling_params(
            hosted, n=self.n if beam else self.num_sequences, beam_width=self.num_sequences if beam else 1,
            max_tokens=max_tokens, logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo and self.logprobs is not None else None,
            forced_token_ids=forced_token_ids,
        )
