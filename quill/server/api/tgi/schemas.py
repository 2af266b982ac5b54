"""text-generation-inference /generate request bodies (pydantic: the HTTP edge only).

Field names, types and defaults are TGI's `GenerateParameters`; `num_beams`, `length_penalty`
and `early_stopping` are Quill's additions (TGI has no beam search). Unknown fields are refused
(request_schema.py), where TGI's serde drops them: a misspelled setting would run with its default.
Every field huggingface_hub's InferenceClient.text_generation sends is declared; those Quill lacks are
accepted only at their off values (null, false) and refused by name otherwise.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quill.server.hosting import HostedModel
from quill.server.sampling import SamplingParams

from ..request_schema import RequestSchema
from ..structured_fields import TGIGrammar, from_tgi_grammar
from ..validation import build_params


class GenerateParameters(RequestSchema):
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
    grammar: TGIGrammar | None = None  # {"type": "json" | "regex", "value": schema or pattern}
    adapter_id: str | None = None  # not supported: rejected when given
    # Quill's extension: beam search
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    coverage_penalty: float = 0.0  # an encoder-decoder's beams: OpenNMT's -beta (sampling/coverage.py)
    coverage_penalty_type: Literal["wu", "summary"] = "wu"
    coverage_penalty_stepwise: bool = False
    no_repeat_ngram_size: int = 0  # Quill's extension: transformers' rule (0: off)

    @property
    def is_sampling(self) -> bool:
        """TGI: any sampling setting turns sampling on, whatever do_sample says."""
        return self.do_sample or any(v is not None for v in (self.temperature, self.top_k, self.top_p))

    @property
    def num_sequences(self) -> int:
        """Sampled sequences, of which the most likely is answered."""
        return 1 if self.best_of is None else self.best_of

    def to_sampling_params(self, hosted: HostedModel, max_new_tokens: int, seed: int | None,
                           stream: bool) -> SamplingParams:
        """`seed`: the request's, or the one the server picked for it, when sampling."""
        beam = self.num_beams > 1
        return build_params(
            hosted, n=self.num_sequences, max_tokens=max_new_tokens,
            # Left out (None): the checkpoint's recommendation, when sampling; TGI stays greedy unless asked to sample.
            temperature=self.temperature if self.is_sampling else 0.0, top_k=self.top_k, top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=0.0 if self.frequency_penalty is None else self.frequency_penalty,
            seed=seed, stop=list(self.stop),
            # Streamed tokens always carry their logprob.
            logprobs=(self.top_n_tokens or 0) if self.details or self.decoder_input_details or stream else None,
            prompt_logprobs=0 if self.decoder_input_details else None,
            use_beam_search=beam, beam_width=self.num_beams if beam else 1,
            length_penalty=self.length_penalty, early_stopping=self.early_stopping,
            coverage_penalty=self.coverage_penalty, coverage_penalty_type=self.coverage_penalty_type,
            coverage_penalty_stepwise=self.coverage_penalty_stepwise,
            structured=from_tgi_grammar(self.grammar), no_repeat_ngram_size=self.no_repeat_ngram_size,
        )


class GenerateRequest(RequestSchema):
    """POST /generate and /generate_stream."""

    inputs: str
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    model: str | None = None  # Quill's extension: which hosted model; None: the default one


class CompatGenerateRequest(GenerateRequest):
    """POST /: TGI's compatibility route, streamed or not as the body says."""

    stream: bool = False
