"""Per-request sampling settings, with vLLM's names and meanings, checked on construction."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ..structured.constraint import StructuredOutput

# Below this a temperature is greedy (vLLM's _SAMPLING_EPS): logits / t would overflow float32 long before 0.
GREEDY_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20  # OpenAI's cap on alternatives per token
MAX_ABS_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values
MAX_ABS_PENALTY = 2.0  # OpenAI's range for presence/frequency penalties
LENGTH_PENALTY_TYPES = ("power", "wu")
COVERAGE_PENALTY_TYPES = ("wu", "summary")
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


class SamplingParamError(ValueError):
    """A setting out of range. `param` names it, so the HTTP layer can answer 400 with `param` set."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param} {message}")
        self.param = param


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value, low: int | None = None, high: int | None = None) -> None:
    """An integer (not a bool) in [low, high]; `high` is only given together with `low`."""
    if not _is_int(value):
        raise SamplingParamError(name, f"must be an integer, got {value!r}")
    if high is not None and not low <= value <= high:
        raise SamplingParamError(name, f"must be in [{low}, {high}], got {value!r}")
    if low is not None and value < low:
        raise SamplingParamError(name, f"must be >= {low}, got {value!r}")


def _check_real(name: str, value, requirement: str, is_ok) -> None:
    """Finite number for which `is_ok(value)` holds; `requirement` says what that means in words."""
    if not _is_real(value) or not math.isfinite(value):
        raise SamplingParamError(name, f"must be a finite number, got {value!r}")
    if not is_ok(value):
        raise SamplingParamError(name, f"must be {requirement}, got {value!r}")


def _check_optional_count(name: str, value) -> None:
    if value is not None:
        _check_int(name, value, 0, MAX_LOGPROBS)


@dataclass(slots=True)
class SamplingParams:
    """How one request picks and stops its tokens. Defaults sample from the raw model distribution."""

    n: int = 1  # completions per prompt; with temperature 0 (and no beam search) all n are identical
    max_tokens: int = 16
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens were generated
    temperature: float = 1.0  # 0 (below GREEDY_TEMPERATURE): greedy
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # HF rule over prompt + output tokens; 1: off
    presence_penalty: float = 0.0  # OpenAI rule over output tokens; 0: off
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None  # token id -> value added to its logit
    seed: int | None = None  # per-request generator: same seed, same tokens, whatever else is batched
    stop: list[str] = field(default_factory=list)  # a single string is accepted and wrapped
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # alternatives per generated token (0: only the chosen one's)
    prompt_logprobs: int | None = None  # alternatives per prompt token (0: only the prompt token's)
    use_beam_search: bool = False
    beam_width: int = 1
    length_penalty: float = 1.0  # beam score = sum logprob / length ** length_penalty
    # "power": that (transformers', fairseq's --lenpen); "wu": / ((5 + length) / 6) ** length_penalty (Wu et al. 2016,
    # OpenNMT's -length_penalty wu -alpha)
    length_penalty_type: Literal["power", "wu"] = "power"
    early_stopping: bool | Literal["never"] = False  # beam search: HF's meaning
    # beta >= 0: an encoder-decoder's finished beam loses beta * a penalty on its coverage, each source token's
    # attention summed over the answer's steps (OpenNMT's -coverage_penalty/-beta; beam_search.py): "wu" (Wu et al.
    # 2016) -sum log min(coverage, 1), "summary" sum max(coverage, 1) - 1
    coverage_penalty: float = 0.0
    coverage_penalty_type: Literal["wu", "summary"] = "wu"
    coverage_penalty_stepwise: bool = False  # in every step's ranking of running beams (OpenNMT's -stepwise_penalty)
    # the first output tokens, forced (transformers' forced_bos_token_id: an encoder-decoder's target language)
    forced_token_ids: list[int] = field(default_factory=list)
    no_repeat_ngram_size: int = 0  # > 0: never repeat an n-gram of this size (transformers' rule); 0: off
    # token sequences whose last token never follows the others (vLLM's bad_words, as its API tokenizes them, and a
    # checkpoint's multi-token bad_words_ids; transformers' rule, ngrams.py)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    skip_special_tokens: bool = True  # leave special tokens out of the text (vLLM's default); ids are kept
    structured: StructuredOutput | None = None  # what the output must match (JSON schema, regex, ...); None: free

    def __post_init__(self):
        _check_int("n", self.n, low=1)
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("min_tokens", self.min_tokens, low=0)
        if self.min_tokens > self.max_tokens:
            raise SamplingParamError(
                "min_tokens", f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        _check_real("temperature", self.temperature, ">= 0", lambda t: t >= 0)
        _check_int("top_k", self.top_k)
        if self.top_k < -1:
            raise SamplingParamError("top_k", f"must be -1 or 0 (off) or >= 1, got {self.top_k!r}")
        _check_real("top_p", self.top_p, "in (0, 1]", lambda p: 0 < p <= 1)
        _check_real("min_p", self.min_p, "in [0, 1]", lambda p: 0 <= p <= 1)
        _check_real("repetition_penalty", self.repetition_penalty, "> 0", lambda p: p > 0)
        for name in ("presence_penalty", "frequency_penalty"):
            _check_real(name, getattr(self, name), "in [-2, 2]", lambda p: abs(p) <= MAX_ABS_PENALTY)
        self._check_logit_bias()
        if self.seed is not None:
            _check_int("seed", self.seed, SEED_MIN, SEED_MAX)
        self._check_stop()
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamError(name, f"must be a boolean, got {getattr(self, name)!r}")
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, low=0)
        words = self.bad_words_token_ids
        if not isinstance(words, list) or not all(isinstance(w, list) and w and all(_is_int(t) and t >= 0 for t in w)
                                                  for w in words):
            raise SamplingParamError("bad_words", f"must be a list of non-empty token id lists, got {words!r}")
        if not isinstance(self.forced_token_ids, list) or not all(_is_int(t) and t >= 0 for t in self.forced_token_ids):
            raise SamplingParamError("forced_token_ids", f"must be a list of token ids, got {self.forced_token_ids!r}")
        if len(self.forced_token_ids) >= self.max_tokens:
            raise SamplingParamError("max_tokens", f"must exceed the {len(self.forced_token_ids)} forced first "
                                                   f"token(s), got {self.max_tokens!r}")
        _check_optional_count("logprobs", self.logprobs)
        _check_optional_count("prompt_logprobs", self.prompt_logprobs)
        self._check_beam_search()
        self._check_structured()

    def _check_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise SamplingParamError("logit_bias", f"must map token ids to numbers, got {self.logit_bias!r}")
        for token_id, bias in self.logit_bias.items():
            if not _is_int(token_id) or token_id < 0:
                raise SamplingParamError("logit_bias", f"keys must be token ids (integers >= 0), got {token_id!r}")
            _check_real("logit_bias", bias, "in [-100, 100]", lambda b: abs(b) <= MAX_ABS_LOGIT_BIAS)

    def _check_stop(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamError("stop", f"must be a list of non-empty strings, got {self.stop!r}")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not isinstance(self.stop_token_ids, list) or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise SamplingParamError(
                "stop_token_ids", f"must be a list of token ids (integers >= 0), got {self.stop_token_ids!r}"
            )

    def _check_beam_search(self) -> None:
        if not isinstance(self.use_beam_search, bool):
            raise SamplingParamError("use_beam_search", f"must be a boolean, got {self.use_beam_search!r}")
        _check_int("beam_width", self.beam_width, low=1)
        _check_real("length_penalty", self.length_penalty, "a finite number", lambda _: True)
        if self.length_penalty_type not in LENGTH_PENALTY_TYPES:
            raise SamplingParamError("length_penalty_type", f"must be one of {', '.join(LENGTH_PENALTY_TYPES)}, got "
                                                            f"{self.length_penalty_type!r}")
        _check_real("coverage_penalty", self.coverage_penalty, ">= 0", lambda v: v >= 0)
        if self.coverage_penalty_type not in COVERAGE_PENALTY_TYPES:
            raise SamplingParamError("coverage_penalty_type", f"must be one of {', '.join(COVERAGE_PENALTY_TYPES)}, "
                                                              f"got {self.coverage_penalty_type!r}")
        if not isinstance(self.coverage_penalty_stepwise, bool):
            raise SamplingParamError("coverage_penalty_stepwise", f"must be a boolean, got "
                                                                  f"{self.coverage_penalty_stepwise!r}")
        if self.coverage_penalty_stepwise and not self.coverage_penalty:
            raise SamplingParamError("coverage_penalty_stepwise", "needs a coverage_penalty above 0")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise SamplingParamError("early_stopping", f'must be true, false or "never", got {self.early_stopping!r}')
        if self.use_beam_search:
            if self.beam_width < self.n:
                raise SamplingParamError(
                    "beam_width", f"must be >= n ({self.n}) with beam search, got {self.beam_width!r}"
                )
            return
        # As vLLM did: a beam-only setting without beam search is a mistake worth reporting, not ignoring.
        if self.beam_width != 1:
            raise SamplingParamError("beam_width", f"needs use_beam_search, got {self.beam_width!r}")
        if self.length_penalty != 1.0:
            raise SamplingParamError("length_penalty", f"needs use_beam_search, got {self.length_penalty!r}")
        if self.length_penalty_type != "power":
            raise SamplingParamError("length_penalty_type", f"needs use_beam_search, got {self.length_penalty_type!r}")
        if self.early_stopping is not False:
            raise SamplingParamError("early_stopping", f"needs use_beam_search, got {self.early_stopping!r}")
        if self.coverage_penalty != 0.0:
            raise SamplingParamError("coverage_penalty", f"needs use_beam_search, got {self.coverage_penalty!r}")
        if self.coverage_penalty_type != "wu":
            raise SamplingParamError("coverage_penalty_type",
                                     f"needs use_beam_search, got {self.coverage_penalty_type!r}")

    def _check_structured(self) -> None:
        if self.structured is None:
            return
        if not isinstance(self.structured, StructuredOutput):
            raise SamplingParamError("structured", f"must be a StructuredOutput, got {self.structured!r}")
        problem = self.structured.problem()
        if problem:
            raise SamplingParamError("structured", problem)

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids named by the request must exist; call at admission, when the model is known."""
        for name, ids in (("logit_bias", self.logit_bias or {}), ("stop_token_ids", self.stop_token_ids),
                          ("forced_token_ids", self.forced_token_ids),
                          ("bad_words", [t for word in self.bad_words_token_ids for t in word])):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise SamplingParamError(name, f"token ids must be < vocab size ({vocab_size}), got {bad[0]!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def bans_by_history(self) -> bool:
        """Whether its next token's bans depend on the tokens before it (no_repeat_ngram_size, bad words): each
        step's mask is filled on the host from them (grammar_masks.py)."""
        return bool(self.no_repeat_ngram_size or self.bad_words_token_ids)

    @property
    def follows_coverage(self) -> bool:
        """Its beams' attention over the source is summed, for the coverage penalty."""
        return self.use_beam_search and self.coverage_penalty > 0

    @property
    def scores_samples(self) -> bool:
        """Whether each sampled token's log-probability is read: logprobs asked for, or n > 1 (ranking samples,
        best_of). Only then is a sample's cumulative_logprob their sum; it is 0.0 otherwise, whatever else
        shares its steps, so that it never depends on how requests were batched."""
        return self.logprobs is not None or self.n > 1

    def needs_only_argmax(self, num_output_tokens: int) -> bool:
        """Whether this request's next token is the argmax of the model's raw scores and nothing else reads
        them: greedy, with no logprobs, penalty, logit bias, min_tokens ban still in force (`num_output_tokens`:
        the sequence's generated tokens so far), grammar, beam search or n > 1 (ranking samples needs their
        log-probabilities). A model may then score only that token (StepBatch.argmax_only)."""
        return (self.is_greedy and not self.scores_samples and self.prompt_logprobs is None and not self.has_penalties
                and not self.logit_bias and num_output_tokens >= self.min_tokens and self.structured is None
                and not self.use_beam_search and not self.bans_by_history)

    def all_stop_token_ids(self, eos_token_ids: Iterable[int]) -> frozenset[int]:
        """Token ids that end this request: stop_token_ids, plus EOS unless ignore_eos."""
        eos = () if self.ignore_eos else eos_token_ids
        return frozenset(self.stop_token_ids).union(eos)
