"""gpu_bench's model shapes and sizes: the full run for a GPU, and a smoke run of tiny shapes for the CPU.

A shape is a transformers family and its config keywords: the benchmark builds random weights of
that shape, so no download is needed and speed is that of the real model (it depends on the shapes
of the weights, not on their values). The LSTM and gated-CNN shapes are the bundled checkpoints
themselves (transformers has no class for them, so they have no generate() baseline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .settings import GPT2_SMALL, TINY_GPT2, VOCAB_32K


@dataclass(frozen=True, slots=True)
class Shape:
    family: str  # a key of checkpoints.HF_FAMILIES ("gpt2", "llama", "mamba", ...), or "bundled"
    config: dict  # keyword arguments of the family's transformers config; for "bundled": {"name": checkpoint}
    hf_batch_size: int  # requests per static batch of the generate() baseline
    description: str


# Llama 3 with a 32k vocabulary (Llama-2's size) instead of its own 128k, as the earlier GPU figures.
_LLAMA3 = dict(vocab_size=VOCAB_32K, num_attention_heads=32, num_key_value_heads=8, rope_theta=500_000.0,
               rms_norm_eps=1e-5, max_position_embeddings=2048, hidden_act="silu")

SHAPES = {
    "gpt2": Shape("gpt2", dict(GPT2_SMALL), 128, "GPT-2 small (124M, 50,257-token vocabulary)"),
    "llama3.2-1b": Shape("llama", _LLAMA3 | dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                                 head_dim=64, tie_word_embeddings=True),
                         128, "Llama-3.2-1B shape, 32k vocabulary (1.0B)"),
    "llama3-8b": Shape("llama", _LLAMA3 | dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                               head_dim=128, tie_word_embeddings=False),
                       64, "Llama-3-8B shape, 32k vocabulary (7.2B)"),
    # The state families, each in the shape of a released model of about 1.3B (random weights).
    "mamba-1.4b": Shape("mamba", dict(vocab_size=50280, hidden_size=2048, num_hidden_layers=48, state_size=16,
                                      expand=2, conv_kernel=4, tie_word_embeddings=True),
                        128, "state-spaces/mamba-1.4b-hf shape (1.4B)"),
    "mamba2-1.3b": Shape("mamba2", dict(vocab_size=50288, hidden_size=2048, num_hidden_layers=48, state_size=128,
                                        expand=2, num_heads=64, head_dim=64, n_groups=1, conv_kernel=4,
                                        chunk_size=256, tie_word_embeddings=True),
                         128, "state-spaces/mamba2-1.3b shape (1.3B)"),
    "lfm2-1.2b": Shape("lfm2", dict(vocab_size=65536, hidden_size=2048, intermediate_size=12288,
                                    block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
                                    num_hidden_layers=16, full_attn_idxs=[2, 5, 8, 10, 12, 14], num_attention_heads=32,
                                    num_key_value_heads=8, conv_L_cache=3, max_position_embeddings=128000,
                                    rope_theta=1e6, tie_word_embeddings=True),
                       128, "LiquidAI/LFM2-1.2B shape (1.2B: 10 conv layers, 6 attention)"),
    # xLSTM-7b's structure at 1.3B: embedding 2048, 24 blocks (xLSTM-7b: 4096, 32).
    "xlstm-1.3b": Shape("xlstm", dict(vocab_size=50304, hidden_size=2048, num_hidden_layers=24, num_heads=4,
                                      qk_dim_factor=0.5, v_dim_factor=1.0),
                        128, "xLSTM-7b's structure at 1.3B (embedding 2048, 24 mLSTM blocks)"),
    "lstm": Shape("bundled", dict(name="shakespeare-lstm"), 128, "the bundled LSTM (3.3M)"),
    "gcnn": Shape("bundled", dict(name="shakespeare-gcnn"), 128, "the bundled gated CNN"),
}

# The same names in the smoke run: tiny models of each family (tied and untied Llama, as the real ones).
_TINY_LLAMA = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu")
TINY_SHAPES = {
    "gpt2": Shape("gpt2", dict(TINY_GPT2), 2, "tiny GPT-2"),
    "llama3.2-1b": Shape("llama", _TINY_LLAMA | dict(tie_word_embeddings=True), 2, "tiny Llama, tied embeddings"),
    "llama3-8b": Shape("llama", _TINY_LLAMA | dict(tie_word_embeddings=False), 2, "tiny Llama, untied embeddings"),
    "mamba-1.4b": Shape("mamba", dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                                      conv_kernel=4), 2, "tiny Mamba"),
    "mamba2-1.3b": Shape("mamba2", dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                                        num_heads=4, head_dim=16, n_groups=1, conv_kernel=4, chunk_size=8),
                         2, "tiny Mamba-2"),
    "lfm2-1.2b": Shape("lfm2", dict(vocab_size=300, hidden_size=32, intermediate_size=96, block_multiple_of=16,
                                    num_hidden_layers=3, full_attn_idxs=[1], num_attention_heads=4,
                                    num_key_value_heads=2, conv_L_cache=3, max_position_embeddings=256),
                       2, "tiny LFM2"),
    # 128 wide: transformers' xLSTM cache rounds q/k widths up to 64
    "xlstm-1.3b": Shape("xlstm", dict(vocab_size=300, hidden_size=128, num_hidden_layers=2, num_heads=4, chunk_size=8),
                        2, "tiny xLSTM"),
    "lstm": SHAPES["lstm"],  # the bundled checkpoints are small already
    "gcnn": SHAPES["gcnn"],
}


@dataclass(frozen=True, slots=True)
class GpuBenchSettings:
    name: str
    shapes: dict[str, Shape] = field(default_factory=lambda: dict(SHAPES))
    # The throughput workload: over HTTP, through the engine in-process and through generate().
    num_requests: int = 256
    concurrency: int = 256  # requests in flight over HTTP and in the engine
    prompt_lens: tuple[int, int] = (32, 512)  # token ids, inclusive range drawn per request
    max_tokens: tuple[int, int] = (32, 256)  # generated exactly (EOS ignored)
    seed: int = 0
    warmup_requests: int = 8  # untimed, other prompts, before each timed run
    # Batch 1: one request alone, median gap between tokens over `batch1_repeats` requests.
    batch1_prompt_len: int = 32
    batch1_new_tokens: int = 128
    batch1_repeats: int = 3
    # Decode-step profile: the engine with `profile_seqs` sequences running, every prompt computed.
    profile_seqs: int = 256
    profile_warm_steps: int = 5  # decode steps before anything is timed
    profile_steps: int = 10  # timed without the profiler, then as many again under it
    # Read bandwidth: the best of `bandwidth_repeats` sums of a float32 tensor of `bandwidth_bytes`.
    bandwidth_bytes: int = 2**31
    bandwidth_repeats: int = 10
    block_size: int = 16
    ready_timeout: float = 600.0  # seconds for the server to load the model and answer /ready
    duration: float = 900.0  # cap on the HTTP run, seconds
    sizing_seconds: float = 30.0  # the burst against a server whose cache --gpu-memory-utilization sized

    def __post_init__(self):
        if min(self.num_requests, self.concurrency, self.batch1_repeats, self.profile_seqs, self.profile_steps) < 1:
            raise ValueError("request counts, repeats and steps must be at least 1")
        for name in ("prompt_lens", "max_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be a range 1 <= low <= high, got {(low, high)}")


FULL = GpuBenchSettings("full")
SMOKE = GpuBenchSettings(
    "smoke", shapes=dict(TINY_SHAPES), num_requests=4, concurrency=4, prompt_lens=(3, 8), max_tokens=(2, 5),
    warmup_requests=1, batch1_prompt_len=4, batch1_new_tokens=4, batch1_repeats=2, profile_seqs=4,
    profile_warm_steps=1, profile_steps=3, bandwidth_bytes=2**20, bandwidth_repeats=2, ready_timeout=120.0,
    duration=120.0, sizing_seconds=3.0,
)
PRESETS = {s.name: s for s in (FULL, SMOKE)}
