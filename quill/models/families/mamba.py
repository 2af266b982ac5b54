"""Mamba-1 (Gu & Dao 2023; transformers' `MambaForCausalLM`) and Falcon-Mamba (`FalconMambaForCausalLM`, the same
blocks plus weightless RMS norms on dt, B and C inside the mixer): embedding -> blocks of RMSNorm + selective-SSM
mixer on a residual stream -> RMSNorm -> logits.

A mixer projects x to (u, z), runs u through a causal depthwise convolution of width d_conv and silu, derives the
input-dependent dt, B and C from it, runs the selective scan (mamba_scan.py) and gates the result with silu(z).

State per sequence, a fixed size whatever its length, for each layer:
- `conv`: the last d_conv - 1 inputs of the convolution, (d_inner, d_conv - 1), in the model's dtype: they are
  copies of its in_proj outputs, so a wider type would hold nothing more (d_conv - 1, not d_conv: the next token's
  convolution reads only those);
- `ssm`: the scan's state, (d_inner, d_state), float32 always: it is a sum of decayed contributions carried over
  thousands of tokens, and rounding it to bfloat16 at every token would compound.
mamba-130m (d_model 768, 24 layers, expand 2 -> d_inner 1536, d_state 16, d_conv 4): 24 x 1536 x 3 window values
and 24 x 1536 x 16 state values = 2,801,664 bytes per sequence in float32 (2.67 MiB), 2,580,480 with a bfloat16
window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..kernels import TORCH_OPS, LayerOps
from ..batch import StepBatch, run_by_parts, split_decodes
from ..state import SlotState
from .mamba_scan import scan_step, selective_scan
from .slot_model import SlotLanguageModel
from .transformer import RMSNorm, rms_normalise

ACTIVATIONS = ("silu", "swish")  # the convolution's activation: the only one Quill runs
# What transformers' MambaConfig / FalconMambaConfig assume when config.json leaves a key out.
DEFAULTS = {"vocab_size": 50280, "hidden_size": 768, "state_size": 16, "num_hidden_layers": 32,
            "layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
            "hidden_act": "silu", "residual_in_fp32": True, "time_step_rank": "auto", "tie_word_embeddings": True}
FALCON_DEFAULTS = {**DEFAULTS, "mixer_rms_eps": 1e-6}


@dataclass
class MambaConfig:
    vocab_size: int
    d_model: int = 768
    n_layers: int = 24
    d_state: int = 16
    d_conv: int = 4
    d_inner: int = 1536  # the mixer's width (config.json's intermediate_size)
    dt_rank: int = 48  # width of the low-rank projection that makes dt
    norm_eps: float = 1e-5
    use_bias: bool = False  # biases on in_proj and out_proj
    use_conv_bias: bool = True
    # The residual stream in float32 whatever the weights' dtype (transformers' residual_in_fp32).
    residual_in_fp32: bool = True
    tie_embeddings: bool = True
    bcdt_norm: bool = False  # Falcon-Mamba: weightless RMS norms on dt (before dt_proj), B and C
    mixer_norm_eps: float = 1e-6
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "d_state", "d_conv", "d_inner", "dt_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


def read_config(raw: dict) -> MambaConfig:
    """A transformers MambaConfig / FalconMambaConfig (config.json, defaults filled in) -> ours.

    Refused, as they would change the outputs: a convolution activation other than silu, LayerNorm blocks. Left
    out, as training alone reads them: time_step_min/max/floor/scale/init_scheme, initializer_range,
    rescale_prenorm_residual, use_mambapy, use_associative_scan (transformers' choice of scan implementation)."""
    if raw["hidden_act"] not in ACTIVATIONS:
        raise ValueError(f"hidden_act {raw['hidden_act']!r} is not implemented (Quill's Mamba runs silu)")
    if raw.get("rms_norm") is False:  # the original mamba_ssm config's LayerNorm blocks
        raise ValueError("rms_norm false (LayerNorm blocks) is not implemented: Quill's Mamba has RMS norms only")
    rank = raw["time_step_rank"]
    return MambaConfig(
        vocab_size=raw["vocab_size"], d_model=raw["hidden_size"], n_layers=raw["num_hidden_layers"],
        d_state=raw["state_size"], d_conv=raw["conv_kernel"],
        # A config.json's intermediate_size wins over expand, as in transformers (falcon-mamba-7b says expand 16
        # beside intermediate_size 8192 = 2 x 4096, and its weights are 8192 wide).
        d_inner=raw.get("intermediate_size") or int(raw["expand"] * raw["hidden_size"]),
        dt_rank=math.ceil(raw["hidden_size"] / 16) if rank == "auto" else int(rank),
        norm_eps=raw["layer_norm_epsilon"], use_bias=raw["use_bias"], use_conv_bias=raw["use_conv_bias"],
        residual_in_fp32=raw["residual_in_fp32"], tie_embeddings=raw["tie_word_embeddings"],
        bcdt_norm=raw["model_type"] == "falcon_mamba",
        mixer_norm_eps=raw.get("mixer_rms_eps", FALCON_DEFAULTS["mixer_rms_eps"]),
        extra={"hf_model_type": raw["model_type"]},
    )


class MambaMixer(nn.Module):
    """Named as transformers names it (`mixer`), so that checkpoint tensor names are our parameter names."""

    def __init__(self, c: MambaConfig):
        super().__init__()
        self.config = c
        self.in_proj = nn.Linear(c.d_model, 2 * c.d_inner, bias=c.use_bias)
        self.conv1d = nn.Conv1d(c.d_inner, c.d_inner, c.d_conv, groups=c.d_inner, bias=c.use_conv_bias)
        self.x_proj = nn.Linear(c.d_inner, c.dt_rank + 2 * c.d_state, bias=False)
        self.dt_proj = nn.Linear(c.dt_rank, c.d_inner)
        self.A_log = nn.Parameter(torch.zeros(c.d_inner, c.d_state))
        self.D = nn.Parameter(torch.ones(c.d_inner))
        self.out_proj = nn.Linear(c.d_inner, c.d_model, bias=c.use_bias)

    def forward(self, x: torch.Tensor, parts, state: SlotState, layer: int, chunk: int | None = None):
        """x (T, d_model) the step's packed tokens, normed -> (T, d_model). `parts`: the step's sequences as
        `split_decodes` groups them; each part's window and ssm state of this `layer` are read from its slots and
        written back. `chunk`: the prefill scan's positions per chunk (None: the device's choice).

        The projections run on the packed tokens; only the convolution and the scan see a part's sequences side by
        side (a prefill part padded to its longest chunk), so neither padding nor a prefill beside them makes
        decode rows cost more."""
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (T, d_inner) each
        y = run_by_parts(parts, lambda part, u: self._part(u, part, state, layer, chunk), u)
        return self.out_proj((y * F.silu(z)).to(x.dtype))

    def _part(self, u: torch.Tensor, part: StepBatch, state: SlotState, layer: int, chunk: int | None):
        """u (T, d_inner) a part's packed in_proj outputs -> the scan's y plus the skip D u of the convolution's
        outputs u, (T, d_inner) float32, before the gate; the part's slots of this layer updated in place."""
        c = self.config
        where = (part.slots, layer)
        fused = kernels.fused_state_steps(state["ssm"])
        # the CPU's kernels also convolve a decode step in its windows (the GPU's have none: conv_step_ is None)
        if (fused is not None and fused.conv_step_ is not None and part.max_query_len == 1
                and state["conv"].dtype == torch.float32):
            u = fused.conv_step_(state["conv"][:, layer], part.slots, u, self.conv1d.weight.squeeze(1),
                                 self.conv1d.bias)
        else:
            # (R, d_inner, d_conv - 1 + Q): the window then the part's inputs, right-padded with zeros
            inputs = part.slide_windows(state["conv"], where, part.pad(u).transpose(1, 2), dim=-1)
            conv = F.silu(F.conv1d(inputs, self.conv1d.weight, self.conv1d.bias, groups=c.d_inner)).transpose(1, 2)
            u = part.unpad(conv)  # (T, d_inner)
        dt, B, C = self.x_proj(u).split([c.dt_rank, c.d_state, c.d_state], dim=-1)
        if c.bcdt_norm:  # Falcon-Mamba: weightless, in float32, back to the model's dtype
            dt, B, C = (rms_normalise(t, c.mixer_norm_eps).type_as(t) for t in (dt, B, C))
        dt = F.softplus(self.dt_proj(dt).float())  # (T, d_inner)
        A = -torch.exp(self.A_log.float())  # (d_inner, d_state)
        u32, B, C = u.float(), B.float(), C.float()
        if fused is not None:  # one read and one write of each slot's state, where it lies
            if part.max_query_len == 1:
                y = fused.mamba_step_(state["ssm"][:, layer], part.slots, u32, dt, A, B, C)
            else:  # padding is zeros, dt 0 among them: inert
                y = part.unpad(fused.mamba_scan_(state["ssm"][:, layer], part.slots, part.pad(u32), part.pad(dt), A,
                                                 part.pad(B), part.pad(C)))
            return y + u32 * self.D.float()
        ssm = state["ssm"][where]  # (R, d_inner, d_state)
        if part.max_query_len == 1:
            y, ssm = scan_step(u32, dt, A, B, C, ssm)
        else:  # padding is zeros, dt 0 among them: those positions leave the state as it was
            y, ssm = selective_scan(part.pad(u32), part.pad(dt), A, part.pad(B), part.pad(C), ssm, chunk)
            y = part.unpad(y)
        state["ssm"][where] = ssm
        return y + u32 * self.D.float()


class MambaBlock(nn.Module):
    """A residual layer's norm and mixer (Mamba's or Mamba-2's)."""

    def __init__(self, width: int, eps: float, mixer: nn.Module):
        super().__init__()
        self.norm = RMSNorm(width, eps)
        self.mixer = mixer


class MambaBackbone(nn.Module):
    """Both Mamba generations' modules as transformers names them (backbone.layers.0.mixer.in_proj.weight, ...):
    embeddings -> layers -> norm_f, the residual stream in float32 (residual_in_fp32) and each norm's input in
    the model's dtype, as transformers runs them."""

    def __init__(self, vocab_size: int, width: int, eps: float, mixers: list[nn.Module]):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleList(MambaBlock(width, eps, mixer) for mixer in mixers)
        self.norm_f = RMSNorm(width, eps)

    def hidden(self, batch: StepBatch, state: SlotState, residual_in_fp32: bool, chunk: int | None) -> torch.Tensor:
        """(T, width) the residual stream after the last layer, for the step's packed tokens; each mixer reads and
        writes its layer of the sequences' slots, a layer at a time, the step split by `split_decodes`. `chunk`:
        the prefill scan's positions per chunk (None: the mixer's choice)."""
        parts = split_decodes(batch)
        x = self.embeddings(batch.token_ids)
        residual = x.float() if residual_in_fp32 else x
        for i, block in enumerate(self.layers):
            residual = residual + block.mixer(block.norm(residual.to(x.dtype)), parts, state, i, chunk)
        return residual

    def logits(self, residual: torch.Tensor, lm_head: nn.Linear | None, ops: LayerOps) -> torch.Tensor:
        """The final norm and the LM head (None: tied to the embeddings), through the layer ops -> float32
        logits. The norm's output takes the embeddings' dtype, the model's (a narrowed head is widened by the
        ops, narrow_weights.py)."""
        weight = self.embeddings.weight if lm_head is None else lm_head.weight
        return ops.linear(self.norm_f(residual).to(self.embeddings.weight.dtype), weight, None).float()


class MambaFamilyModel(SlotLanguageModel):
    """Both Mamba generations' language model: the backbone over `mixers`, then the output layer `lm_head`, or
    the embeddings where the config ties them. The config names vocab_size, norm_eps, residual_in_fp32 and
    tie_embeddings alike in both."""

    layer_ops: LayerOps = TORCH_OPS  # the loader's choice: how the output layer's product runs (oneDNN's on the CPU)

    def __init__(self, config, width: int, mixers: list[nn.Module]):
        super().__init__()
        self.config = config
        self.backbone = MambaBackbone(config.vocab_size, width, config.norm_eps, mixers)
        self.lm_head = None if config.tie_embeddings else nn.Linear(width, config.vocab_size, bias=False)
        # Positions per chunk of a prefill's scan, any size giving the same result; None: the mixer's choice
        # (Mamba-1: the device's, mamba_scan.chunk_length; Mamba-2: its config's chunk_size).
        self.scan_chunk: int | None = None

    def _hidden(self, batch: StepBatch, state: SlotState) -> torch.Tensor:
        return self.backbone.hidden(batch, state, self.config.residual_in_fp32, self.scan_chunk)

    def _logits(self, residual: torch.Tensor) -> torch.Tensor:
        return self.backbone.logits(residual, self.lm_head, self.layer_ops)


class MambaLanguageModel(MambaFamilyModel):
    def __init__(self, config: MambaConfig):
        super().__init__(config, config.d_model, [MambaMixer(config) for _ in range(config.n_layers)])

    def new_state(self, num_slots: int, dtype: torch.dtype | None = None) -> SlotState:
        """Per slot and layer: `conv` (d_inner, d_conv - 1) in `dtype` (default: the weights'), `ssm`
        (d_inner, d_state) in float32 (see the module docstring)."""
        c, like = self.config, self.backbone.embeddings.weight
        return SlotState({
            "conv": torch.zeros(num_slots, c.n_layers, c.d_inner, c.d_conv - 1, dtype=dtype or like.dtype,
                                device=like.device),
            "ssm": torch.zeros(num_slots, c.n_layers, c.d_inner, c.d_state, dtype=torch.float32, device=like.device),
        })
