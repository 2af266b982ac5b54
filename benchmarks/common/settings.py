"""How big each benchmark is: engine_bench's full suite, a one-minute version and a seconds-long smoke run;
http_bench's full run and smoke run."""

from __future__ import annotations

from dataclasses import dataclass, field

# GPT-2 small: 12 layers, 768 wide, 12 heads, 50257-token vocabulary, 1024 positions (124M parameters).
GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
VOCAB_32K = 32_000  # the "32k vocabulary" of Llama-2 and Mistral: GPT-2 small with it has 110M parameters
# Seconds to run: tiny shapes; checks the code paths, measures nothing useful.
TINY_GPT2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=64)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    name: str
    gpt2: dict = field(default_factory=lambda: dict(GPT2_SMALL))  # GPT2Config keyword arguments
    num_requests: int = 64  # submitted at once
    prompt_lens: tuple[int, int] = (32, 128)  # inclusive range, drawn uniformly per request
    max_tokens: tuple[int, int] = (16, 128)
    seed: int = 0  # the workload's draws; warm-up requests use seed + 1
    hf_serial_subset: int = 8  # requests timed one at a time through HF generate, then extrapolated
    recurrent_serial_subset: int = 16  # requests timed one at a time for the LSTM / gated CNN
    decode_prompt_len: int = 32  # single-request decode
    decode_new_tokens: int = 128
    decode_repeats: int = 3  # median over repeats
    matmul_size: int = 2048  # n of the n x n x n float32 matmul that measures peak FLOP/s
    matmul_repeats: int = 5  # best of
    bandwidth_bytes: int = 2**30  # float32 tensor summed to measure read bandwidth
    bandwidth_repeats: int = 5  # best of
    recurrent_models: str = "default"  # "default": bundled checkpoints (else random weights, same shapes); "tiny"
    block_size: int = 16

    def __post_init__(self):
        for name in ("prompt_lens", "max_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be a range 1 <= low <= high, got {(low, high)}")
        if self.recurrent_models not in ("default", "tiny"):
            raise ValueError(f"recurrent_models must be 'default' or 'tiny', not {self.recurrent_models!r}")
        limit = self.gpt2["n_positions"]
        if self.prompt_lens[1] + self.max_tokens[1] > limit or self.decode_prompt_len + self.decode_new_tokens > limit:
            raise ValueError(f"prompts plus max_tokens must fit the model's {limit} positions")


FULL = BenchSettings("full")

# About a minute on 2 cores: the same GPT-2-small model, a quarter of the traffic, shorter requests.
QUICK = BenchSettings(
    "quick", num_requests=16, prompt_lens=(16, 64), max_tokens=(8, 32), hf_serial_subset=2,
    recurrent_serial_subset=4, decode_new_tokens=32, decode_repeats=1, matmul_repeats=3,
    bandwidth_bytes=2**28, bandwidth_repeats=3,
)

# Seconds: tiny random models and a handful of tokens; checks the code paths, measures nothing useful.
SMOKE = BenchSettings(
    "smoke", gpt2=TINY_GPT2,
    num_requests=4, prompt_lens=(3, 8), max_tokens=(2, 5), hf_serial_subset=2, recurrent_serial_subset=2,
    decode_prompt_len=4, decode_new_tokens=4, decode_repeats=2, matmul_size=64, matmul_repeats=2,
    bandwidth_bytes=2**20, bandwidth_repeats=2, recurrent_models="tiny",
)

PRESETS = {s.name: s for s in (FULL, QUICK, SMOKE)}


@dataclass(frozen=True, slots=True)
class HttpBenchSettings:
    """http_bench: the model it builds, the workload it sends, and the baselines' sizes."""

    name: str
    gpt2: dict = field(default_factory=lambda: GPT2_SMALL | {"vocab_size": VOCAB_32K})  # GPT2Config keywords
    num_requests: int = 64
    concurrency: int = 64  # requests in flight over HTTP, and in the in-process engine
    prompt_lens: tuple[int, int] = (32, 128)  # inclusive range, drawn uniformly per request
    max_tokens: tuple[int, int] = (16, 128)
    prompts: str = "ids"  # exact-length token-id prompts, or "text" (see quill/clients/bench/workload.py)
    mix: str = "greedy"  # decoding strategies, as `quill bench --mix` takes them
    seed: int = 0
    warmup_requests: int = 4  # untimed, other prompts, before the HTTP run and the engine run
    hf_batch_size: int | None = None  # static batches of this many; None: the concurrency
    hf_serial_subset: int = 8  # requests timed one at a time through HF generate (0: skip that run)
    block_size: int = 16
    ready_timeout: float = 600.0  # seconds for the server to load the model and answer /ready
    duration: float = 3600.0  # cap on the HTTP run, seconds

    def __post_init__(self):
        if self.num_requests < 1 or self.concurrency < 1:
            raise ValueError("num_requests and concurrency must be at least 1")
        if self.warmup_requests < 0 or self.hf_serial_subset < 0:
            raise ValueError("warmup_requests and hf_serial_subset must be at least 0")
        for name in ("prompt_lens", "max_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be a range 1 <= low <= high, got {(low, high)}")

    @property
    def batch_size(self) -> int:
        return self.hf_batch_size or self.concurrency


HTTP_FULL = HttpBenchSettings("full")
HTTP_SMOKE = HttpBenchSettings(
    "smoke", gpt2=TINY_GPT2, num_requests=4, concurrency=4, prompt_lens=(3, 8), max_tokens=(2, 5),
    warmup_requests=1, hf_serial_subset=2,
)
HTTP_PRESETS = {s.name: s for s in (HTTP_FULL, HTTP_SMOKE)}
