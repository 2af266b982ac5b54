"""Mamba-2 (Dao & Gu 2024), as Hugging Face's `Mamba2ForCausalLM` stores it (model_type "mamba2":
state-spaces/mamba2-*, Mamba-Codestral-7B).

Embedding -> layers of (RMSNorm -> mixer, residual) -> RMSNorm -> softmax. The mixer projects each token to a
gate z, the stream xBC and a time step per head; xBC goes through a short causal depthwise convolution and
SiLU, splits into x (heads of head_dim), B and C (n_groups of d_state), and runs the selective state-space
recurrence of quill/models/families/ssd.py with a skip D x; a grouped RMSNorm gated by SiLU(z) and a projection close it.

State per sequence and layer, a fixed size whatever the length:
- "conv": the last d_conv - 1 inputs of the convolution, (d_conv - 1, conv_dim), conv_dim = d_inner +
  2 n_groups d_state, in the model's dtype (what the convolution reads in a full pass);
- "ssm": the recurrence's state, (num_heads, head_dim, d_state), always float32: it accumulates thousands
  of decayed terms, which bfloat16 would round away.
For mamba2-130m (hidden 768, 24 layers, expand 2, head_dim 64 so 24 heads, d_state 128, n_groups 1, d_conv 4):
conv 24 x 3 x 1792 x 4 B = 516,096 B, ssm 24 x 24 x 64 x 128 x 4 B = 18,874,368 B: 19,390,464 B (18.5 MiB)
per sequence in float32, 19,132,416 B with a bfloat16 conv window; the SSM state is 97% of it.
A step reads and writes one layer's slots at a time, so no copy of every layer's state is made at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..batch import StepBatch, run_by_parts
from ..state import SlotState
from .mamba import MambaFamilyModel
from .ssd import ssd_chunked, ssd_step
from .transformer import rms_normalise

ACTIVATIONS = ("silu", "swish")  # the convolution's activation; the gate is SiLU in every Mamba-2
MAX_SCAN_CHUNK = 64  # see read_config


@dataclass
class Mamba2Config:
    vocab_size: int
    hidden_size: int = 768
    num_layers: int = 24
    expand: int = 2
    num_heads: int = 24  # num_heads * head_dim = expand * hidden_size (d_inner)
    head_dim: int = 64
    state_size: int = 128  # d_state
    n_groups: int = 1  # B and C are shared by num_heads / n_groups heads; the gated norm is per group too
    conv_kernel: int = 4
    use_bias: bool = False  # on in_proj and out_proj
    use_conv_bias: bool = True
    norm_eps: float = 1e-5
    residual_in_fp32: bool = True  # the residual stream stays float32 under a bfloat16 model
    time_step_limit: tuple[float, float] = (0.0, math.inf)  # dt is clamped to it after the softplus
    # False: RMSNorm(y * SiLU(z)), what transformers' Mamba2 and mamba_ssm's default compute;
    # True: RMSNorm(y) * SiLU(z) (FalconH1's mamba_norm_before_gate).
    norm_before_gate: bool = False
    chunk_size: int = 64  # tokens per chunk of the prefill scan: its speed, not its result
    tie_embeddings: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.expand * self.hidden_size != self.num_heads * self.head_dim:
            raise ValueError(f"expand * hidden_size ({self.expand * self.hidden_size}) must equal num_heads * "
                             f"head_dim ({self.num_heads * self.head_dim})")
        if self.n_groups < 1 or self.num_heads % self.n_groups:
            raise ValueError(f"n_groups ({self.n_groups}) must divide num_heads ({self.num_heads})")
        if self.conv_kernel < 1 or self.chunk_size < 1:
            raise ValueError("conv_kernel and chunk_size must be at least 1")
        low, high = self.time_step_limit = tuple(float(v) for v in self.time_step_limit)
        if not 0.0 <= low <= high:
            raise ValueError(f"time_step_limit must be (low, high) with 0 <= low <= high, not {self.time_step_limit}")

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.n_groups * self.state_size


def _json_float(value) -> float:
    """A float as config.json writes it: a number, "inf"/"Infinity", or transformers 5's {"__float__": "Infinity"}."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def read_config(raw: dict) -> Mamba2Config:
    """A transformers Mamba2Config's config.json (defaults filled in) -> our config."""
    if raw["hidden_act"] not in ACTIVATIONS:
        raise ValueError(f"mamba2 hidden_act {raw['hidden_act']!r} is not implemented (only silu)")
    if raw.get("rms_norm") is False:  # a mamba_ssm option: no norm at all, y * SiLU(z)
        raise ValueError("mamba2 with rms_norm false (no gated RMSNorm) is not implemented")
    # The scan's chunks are the checkpoint's (256 in the released ones) but at most MAX_SCAN_CHUNK: any size gives
    # the same result, and in a 2,000-token prefill of the 130m shape on 2 CPU cores chunks of 64 took 5.1 CPU s
    # where 256 took 7.9 (benchmarks/mamba2_prefill.py; likely cache misses: each head's (chunk x chunk) decay
    # matrix is 16x larger at 256).
    # config.json's norm_before_gate is not read: transformers' Mamba2 ignores the key and always gates first,
    # and Mamba-Codestral's config says true for weights trained gating first (mamba_ssm's default).
    return Mamba2Config(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], num_layers=raw["num_hidden_layers"],
        expand=raw["expand"], num_heads=raw["num_heads"], head_dim=raw["head_dim"], state_size=raw["state_size"],
        n_groups=raw["n_groups"], conv_kernel=raw["conv_kernel"], use_bias=raw["use_bias"],
        use_conv_bias=raw["use_conv_bias"], norm_eps=raw["layer_norm_epsilon"],
        residual_in_fp32=raw["residual_in_fp32"],
        time_step_limit=tuple(_json_float(v) for v in raw["time_step_limit"]),
        chunk_size=min(raw["chunk_size"], MAX_SCAN_CHUNK),
        tie_embeddings=raw["tie_word_embeddings"], extra={"hf_model_type": raw["model_type"]},
    )


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of d_inner / n_groups channels, gated by SiLU(z), in float32."""

    def __init__(self, size: int, n_groups: int, eps: float, norm_before_gate: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.n_groups, self.eps, self.norm_before_gate = n_groups, eps, norm_before_gate

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        gate = F.silu(z.float())
        y = y.float() if self.norm_before_gate else y.float() * gate
        y = rms_normalise(y.unflatten(-1, (self.n_groups, -1)), self.eps).flatten(-2)
        return self.weight * (y * gate if self.norm_before_gate else y)


class Mamba2Mixer(nn.Module):
    def __init__(self, config: Mamba2Config):
        super().__init__()
        c = self.config = config
        self.in_proj = nn.Linear(c.hidden_size, c.intermediate_size + c.conv_dim + c.num_heads, bias=c.use_bias)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.conv_kernel, groups=c.conv_dim, bias=c.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(c.num_heads))
        self.A_log = nn.Parameter(torch.zeros(c.num_heads))  # A = -exp(A_log): each head's decay rate
        self.D = nn.Parameter(torch.ones(c.num_heads))
        self.norm = GatedRMSNorm(c.intermediate_size, c.n_groups, c.norm_eps, c.norm_before_gate)
        self.out_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.use_bias)

    def forward(self, h: torch.Tensor, parts, state: SlotState, layer: int, chunk: int | None = None) -> torch.Tensor:
        """h (T, hidden) the step's packed tokens, normed -> (T, hidden). `parts`: the step's sequences as
        `split_decodes` groups them; each part's window and ssm state of this `layer` are read from its slots and
        written back. The projections and the gated norm run on the packed tokens; only the convolution and the
        scan see a part's sequences side by side (padded to its longest), so decode rows never pay for a prefill's
        padding. `chunk`: the prefill scan's positions per chunk (None: the config's chunk_size)."""
        c = self.config
        z, xbc, dt = self.in_proj(h).split([c.intermediate_size, c.conv_dim, c.num_heads], dim=-1)
        chunk = chunk or c.chunk_size
        y = run_by_parts(parts, lambda part, xbc, dt: self._part(xbc, dt, part, state, layer, chunk), xbc, dt)
        return self.out_proj(self.norm(y, z).to(h.dtype))

    def _part(self, xbc: torch.Tensor, dt: torch.Tensor, part: StepBatch, state: SlotState, layer: int, chunk: int):
        """A part's packed xbc (T, conv_dim) and dt (T, heads) -> y (T, d_inner) float32, before the gated norm;
        the part's slots of this `layer` updated in place."""
        c = self.config
        where = (part.slots, layer)
        full = part.slide_windows(state["conv"], where, part.pad(xbc))  # (B, d_conv - 1 + Q, conv_dim)
        xbc = F.silu(self.conv1d(full.transpose(1, 2)).transpose(1, 2))  # (B, Q, conv_dim)
        x, B, C = xbc.float().split([c.intermediate_size, c.n_groups * c.state_size, c.n_groups * c.state_size], -1)
        x = x.unflatten(-1, (c.num_heads, c.head_dim))
        B, C = B.unflatten(-1, (c.n_groups, c.state_size)), C.unflatten(-1, (c.n_groups, c.state_size))
        # padded after the softplus: a padding position's dt is 0, so it leaves the state as it was
        dt = part.pad(F.softplus(dt.float() + self.dt_bias.float()).clamp(*c.time_step_limit))
        A = -torch.exp(self.A_log.float())
        fused = kernels.fused_state_steps(state["ssm"]) if part.max_query_len == 1 else None
        if fused is not None:  # one read and one write of each slot's state, where it lies
            y = fused.ssd_step_(state["ssm"][:, layer], part.slots, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0])
            return part.unpad((y[:, None] + self.D.float()[:, None] * x).flatten(-2))
        if part.max_query_len == 1:
            y, ssm = ssd_step(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], state["ssm"][where])
            y = y[:, None]
        else:
            y, ssm = ssd_chunked(x, dt, A, B, C, state["ssm"][where], chunk)
        state["ssm"][where] = ssm
        return part.unpad((y + self.D.float()[:, None] * x).flatten(-2))  # (T, d_inner)


class Mamba2LanguageModel(MambaFamilyModel):
    def __init__(self, config: Mamba2Config):
        super().__init__(config, config.hidden_size, [Mamba2Mixer(config) for _ in range(config.num_layers)])

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        """Per slot: "conv" (layers, d_conv - 1, conv_dim) in `dtype` (default: the weights'), "ssm" (layers,
        heads, head_dim, d_state) in float32."""
        c, like = self.config, self.backbone.embeddings.weight
        conv = torch.zeros(num_slots, c.num_layers, c.conv_kernel - 1, c.conv_dim, dtype=dtype or like.dtype,
                           device=like.device)
        ssm = torch.zeros(num_slots, c.num_layers, c.num_heads, c.head_dim, c.state_size, dtype=torch.float32,
                          device=like.device)
        return SlotState({"conv": conv, "ssm": ssm})
