"""Batched sampling: per-request settings, logits processors, the token pick, and stop rules."""

from ..structured.constraint import StructuredOutput  # what an answer must match, part of a request's settings
from .batch import SamplingBatch, new_generator
from .params import SamplingParamError, SamplingParams
from .sampler import PromptLogprobs, SamplerOutput, process_logits, prompt_logprobs, sample
from .stop import StopChecker, StopDecision
from .table import build_batch

__all__ = [
    "PromptLogprobs",
    "SamplerOutput",
    "SamplingBatch",
    "SamplingParamError",
    "SamplingParams",
    "StopChecker",
    "StopDecision",
    "StructuredOutput",
    "build_batch",
    "new_generator",
    "process_logits",
    "prompt_logprobs",
    "sample",
]
