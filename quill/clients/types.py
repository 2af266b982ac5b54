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
    encoder_decoder: bool = False  # a translation or summarization model: the prompt is its source
    languages: list[str] = field(default_factory=list)  # codes its source_lang/target_lang take; [] for none
    max_source_len: int | None = None  # source tokens its encoder reads

    @classmethod
    def from_json(cls, m: dict) -> "ModelInfo":
        return cls(m["id"], m.get("architecture"), m.get("max_model_len"), bool(m.get("encoder_decoder")),
                   list(m.get("languages") or []), m.get("max_source_len"))
