"""Typed results of the client calls."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprobs:
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]


@dataclass
class Choice:
    index: int
    text: str
    finish_reason: str | None
    logprobs: Logprobs | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass
class Completion:
    id: str
    model: str
    choices: list[Choice]
    usage: Usage = field(default_factory=Usage)

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text if self.choices else ""

    @classmethod
    def from_json(cls, data: dict) -> "Completion":
        choices = []
        for c in data.get("choices", []):
            lp = c.get("logprobs")
            logprobs = Logprobs(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]) if lp else None
            choices.append(Choice(c["index"], c["text"], c.get("finish_reason"), logprobs))
        return cls(data.get("id", ""), data.get("model", ""), choices, Usage(**(data.get("usage") or {})))


@dataclass
class ModelInfo:
    id: str
    architecture: str | None = None
    max_model_len: int | None = None
