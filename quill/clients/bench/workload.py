"""What a benchmark sends: the request mix, the prompts, their lengths, the seeds, when each request leaves.

The one workload definition of the repository: `quill bench` sends it over HTTP, and the
in-process runs of `benchmarks/` (Quill's engine, transformers `generate()`) replay the same
requests, so every figure of a comparison is measured on the same work.

Prompts are of two kinds:
- text (`quill bench`'s default): words drawn (seeded) from a list of common Shakespearean words,
  built without a tokenizer. Each model's tokens per word (from one probe) turns `prompt_len` into a
  word count, so lengths are in tokens approximately, for any tokenizer; the JSON records the exact
  counts the server reports. An encoder-decoder (translation) model's prompt is its source text, sized to
  its encoder's `max_source_len`, and its requests carry its languages (target languages in turn).
- token ids: exactly `prompt_len` ids drawn from [1, vocab_size) (id 0 is left out: the benchmarks'
  tokenizers keep end-of-sequence there). No two prompts share a prefix, so prefix caching cannot help.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

WORDS = (
    "the and to of I you my a that in is not it me with for be his your this but he have as thou so him will what "
    "thy all her no do by shall if are we thee on lord our king good now sir from come or well then let they would "
    "love was more here there how her man which doth upon like hath one make say yet let us may must speak heart "
    "night day death life blood time sweet fair gentle noble honour grace heaven earth father mother son brother "
    "daughter queen prince duke crown sword war peace fear hope grief joy tears eyes hand tongue head soul mind "
    "world nature fortune friend enemy master servant house court field sea sun moon stars fire air words name "
    "truth faith heard know think see hear tell give take bring stand stay go fly rest sleep dream wake weep laugh "
    "die live speak swear pray bid call send keep lose find seek fight kill save"
).split()


@dataclass(frozen=True)
class Strategy:
    """A decoding setting of the mix: client keyword options (see `clients.request.completion_body`)."""

    name: str
    options: dict = field(hash=False)

    @property
    def answers_at_end(self) -> bool:
        """Beam search streams nothing until it finishes, so it has no first-token or inter-token times."""
        return "beam_width" in self.options


# Fixed names; `beamK` (width K) and `nK` (K samples at temperature 1) are parsed from the name.
NAMED_STRATEGIES = {
    "greedy": dict(temperature=0),
    "sample": dict(temperature=1.0),
    "temperature": dict(temperature=0.7),
    "top_k": dict(temperature=1.0, top_k=40),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "min_p": dict(temperature=1.0, min_p=0.05),
    "beam": dict(beam_width=4),
}


def strategy(name: str) -> Strategy:
    if name in NAMED_STRATEGIES:
        return Strategy(name, dict(NAMED_STRATEGIES[name]))
    if m := re.fullmatch(r"beam(\d+)", name):
        return Strategy(name, dict(beam_width=int(m[1])))
    if m := re.fullmatch(r"n(\d+)", name):
        return Strategy(name, dict(temperature=1.0, n=int(m[1])))
    raise ValueError(f"unknown decoding strategy {name!r} (known: {', '.join(NAMED_STRATEGIES)}, beamK, nK)")


def parse_mix(text: str) -> list[tuple[Strategy, float]]:
    """'greedy=0.4,top_p=0.3,beam=0.1,n2=0.2' -> strategies with weights summing to 1 (a bare name weighs 1)."""
    mix = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"--mix: weight of {name!r} is not a number: {weight!r}") from None
        if w < 0:
            raise ValueError(f"--mix: weight of {name!r} is negative")
        mix.append((strategy(name.strip()), w))
    total = sum(w for _, w in mix)
    if not mix or total <= 0:
        raise ValueError(f"--mix needs at least one strategy with a positive weight, got {text!r}")
    return [(s, w / total) for s, w in mix]


def parse_range(text: str, name: str) -> tuple[int, int]:
    """'64' -> (64, 64); '32:128' -> (32, 128), drawn uniformly, both ends included."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high) if sep else int(low)
    except ValueError:
        raise ValueError(f"{name} must be N or LOW:HIGH, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} must satisfy 1 <= LOW <= HIGH, got {text!r}")
    return lo, hi


SOURCE_MARKERS = 3  # tokens an encoder-decoder's source holds besides its text (a language or <s>, </s>), and a spare

PROMPT_KINDS = {  # kind -> how the JSON describes it
    "text": "seeded random Shakespearean words; lengths in tokens via each model's tokens-per-word",
    "ids": "seeded random token ids in [1, vocab_size), exactly prompt_len of them",
}


@dataclass(frozen=True)
class TargetModel:
    """What sizing a model's prompts needs to know about it, and the languages an encoder-decoder's requests carry."""

    max_model_len: int  # an encoder-decoder's: its decoder's (start token and output)
    tokens_per_word: float = 1.0  # text prompts: measured with the model's tokenizer
    vocab_size: int | None = None  # token-id prompts: ids are drawn below it
    encoder_decoder: bool = False
    max_source_len: int | None = None  # an encoder-decoder's source limit (None: max_model_len)
    source_lang: str | None = None
    target_langs: tuple[str, ...] = ()  # the model's requests take these in turn; () for none


@dataclass
class WorkloadSpec:
    num_requests: int = 64
    prompt_len: tuple[int, int] = (32, 128)  # tokens: exact for id prompts, about right for text
    max_tokens: tuple[int, int] = (16, 128)
    mix: list[tuple[Strategy, float]] = field(default_factory=lambda: parse_mix("greedy"))
    models: list[str] = field(default_factory=list)  # requests go round-robin over these
    rate: float | None = None  # requests/s, Poisson arrivals; None: all due at once (fixed concurrency)
    stream: bool = True
    ignore_eos: bool = True  # so that every request generates exactly its max_tokens
    seed: int = 0
    prompts: str = "text"  # or "ids" (see the module docstring)

    def __post_init__(self):
        if self.num_requests < 1:
            raise ValueError("--num-requests must be at least 1")
        if self.prompts not in PROMPT_KINDS:
            raise ValueError(f"prompts must be one of {', '.join(PROMPT_KINDS)}, got {self.prompts!r}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("--rate must be positive")

    def describe(self) -> dict:
        return {
            "num_requests": self.num_requests, "prompt_len": list(self.prompt_len), "max_tokens": list(self.max_tokens),
            "mix": {s.name: round(w, 6) for s, w in self.mix}, "models": self.models, "rate": self.rate,
            "stream": self.stream, "ignore_eos": self.ignore_eos, "seed": self.seed,
            "prompts": PROMPT_KINDS[self.prompts],
        }


@dataclass
class BenchRequest:
    index: int
    model: str
    prompt: str | list[int]  # text, or token ids
    target_prompt_tokens: int
    max_tokens: int
    strategy: Strategy
    send_at: float  # seconds after the start of the run (0 for all under fixed concurrency)
    seed: int
    encoder_decoder: bool = False
    source_lang: str | None = None
    target_lang: str | None = None

    def options(self, ignore_eos: bool) -> dict:
        """Keyword options for `completion_body` (a language left unset is left out)."""
        extra = {} if "beam_width" in self.strategy.options else {"seed": self.seed}
        return dict(model=self.model, max_tokens=self.max_tokens, ignore_eos=ignore_eos or None,
                    source_lang=self.source_lang, target_lang=self.target_lang, **self.strategy.options, **extra)


def make_prompt(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, num_words)))


def make_id_prompt(rng: random.Random, num_tokens: int, vocab_size: int) -> list[int]:
    return [rng.randrange(1, vocab_size) for _ in range(num_tokens)]


def _prompt(spec: WorkloadSpec, rng: random.Random, target: TargetModel, num_tokens: int) -> str | list[int]:
    if spec.prompts == "ids":
        if not target.vocab_size or target.vocab_size < 2:
            raise ValueError("token-id prompts need each model's vocab_size")
        return make_id_prompt(rng, num_tokens, target.vocab_size)
    # Under-shoot the word count a little: the tokens-per-word ratio is an average.
    return make_prompt(rng, max(1, int(num_tokens / target.tokens_per_word * 0.9)))


def build_requests(spec: WorkloadSpec, targets: dict[str, TargetModel], salt: int = 0) -> list[BenchRequest]:
    """The whole workload, reproducible from `spec.seed` (and `salt`, which warm-up requests change).

    A request that would not fit its model's context gets a shorter prompt, then fewer new tokens. An
    encoder-decoder's source fits its encoder and its output its decoder, apart; its target languages go in turn.
    """
    rng = random.Random(spec.seed * 1_000_003 + salt)
    strategies, weights = zip(*spec.mix)
    clock, requests = 0.0, []
    for i in range(spec.num_requests):
        model = spec.models[i % len(spec.models)]
        target = targets[model]
        limit = target.max_model_len
        if target.encoder_decoder:  # the same draws, in the same order, as a decoder-only model's
            max_tokens = min(rng.randint(*spec.max_tokens), max(1, limit - 1))  # the decoder's start token
            if target.target_langs:  # a target language may be forced as the first token, which max_tokens counts
                max_tokens = max(max_tokens, 2)
            source_limit = (target.max_source_len or limit) - SOURCE_MARKERS
            prompt_tokens = max(1, min(rng.randint(*spec.prompt_len), source_limit))
        else:
            max_tokens = min(rng.randint(*spec.max_tokens), max(1, limit // 2))
            prompt_tokens = max(1, min(rng.randint(*spec.prompt_len), limit - max_tokens - 2))
        prompt = _prompt(spec, rng, target, prompt_tokens)
        if spec.rate is not None:
            clock += rng.expovariate(spec.rate)
        turn = i // len(spec.models)  # this model's request number
        requests.append(BenchRequest(
            i, model, prompt, prompt_tokens, max_tokens, rng.choices(strategies, weights)[0],
            clock if spec.rate is not None else 0.0, spec.seed * 100_000 + i, target.encoder_decoder,
            target.source_lang, target.target_langs[turn % len(target.target_langs)] if target.target_langs else None,
        ))
    return requests
