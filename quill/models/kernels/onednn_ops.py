"""The CPU's layer ops: the reference ops, with linear layers whose weights oneDNN lays out once.

`F.linear` on the CPU hands the weight to the BLAS library as it is stored, and the library re-blocks it for
its kernel on every call. oneDNN's linear over a weight reordered once into its own blocked layout skips
that work (what vLLM's CPU build does with its prepacked GEMMs): at 64 rows of GPT-2-small shapes, 1.1-1.6x in
float32 on a 2-core AVX2 EPYC; at 256 rows F.linear is as fast or 10% faster, so inputs of more than
`PACKED_MAX_ROWS` rows (prompt chunks, large batches) keep F.linear (`python -m benchmarks.cpu_linear`), but for
wide output layers (`WIDE_OUTPUTS`: a vocabulary), where oneDNN stays ahead up to `WIDE_MAX_ROWS` (a Marian
58,101 x 512 output layer at 256 rows: 104 against 161 ms; 32,000 x 768: 0.93x F.linear's time). On one
thread of that AVX2 CPU the packed path paid only for wide output layers: there F.linear ran GPT-2-small's
layers 7-10% faster at 64 rows, the 32k output layer 15% slower, and a whole run of 128 requests 2.4-2.8% faster
with F.linear for all but the output layer (two alternating A/Bs in process). With AVX-512 (a Xeon) the packed
product is ahead on one thread too: 15-35% more GFLOP/s at 16-37 rows, level or ahead at 64, and in process
the vLLM side-by-side's load ran decode steps of 160-167 ms against F.linear's 170-195 (five alternating
runs). Those limits are float32's: in bfloat16 (a CPU with AVX-512-BF16 or AMX) oneDNN's packed product is
1.2-2.4x F.linear's at every row count from 16 to 2,048 on 2 threads of an AMX Xeon, and fuses the activation
that F.linear leaves to a separate pass, so bfloat16 inputs always go the packed way. In float32 on that Xeon the
packed product also stays level or ahead past 128 rows (0.9-1.3x F.linear's rate from 128 to 512 rows at GPT-2's
and Marian's shapes, noisy), and whole runs say more: the vLLM side-by-side's load in process, whose steps with
prompt tokens have 145 rows at the median, went from 265-325 to 306-351 tokens/s on 2 threads (four runs of
each, alternating) and 5% faster on one, compiling a kernel for each new row count (below) included; so with
AVX-512 the limit is `PACKED_MAX_ROWS_AVX512`. The packed copy is made on a weight's first use and kept beside it,
so that everything else reading weights (tied embeddings, saving, training) sees them unchanged: the linear weights
take their memory twice. A weight replaced, or changed in place outside inference mode, is packed again; a dtype
oneDNN cannot pack on this CPU (bfloat16 without AVX-512) runs `F.linear`, as does a bfloat16 weight under float32
inputs (narrow_weights.py).

oneDNN compiles a kernel for every row count it meets (2.5 ms each; kept in a cache of 1,024), and a server's
steps have any row count up to the step's token budget: a 128-request run compiled 420 of them, a second of its
25, and a long-running server would keep evicting and compiling again. So on CPUs with AMX, bfloat16 inputs of
more than 16 rows are padded up to one of eight counts per doubling (`padded_rows`: at most 1/8 more rows; up to
128 rows, whole 16-row AMX tiles, which cost nothing more to fill), and 71 row counts cover every step up to 8,192
tokens. (Without AMX, padding small products would cost real arithmetic: they keep their own row counts.)
"""

from __future__ import annotations

import functools
import weakref

import torch

from .torch_ops import ACTIVATIONS, TorchLayerOps

PACKED_MAX_ROWS = 128  # float32 without AVX-512 (the AVX2 EPYC's limit)
PACKED_MAX_ROWS_AVX512 = 512
WIDE_OUTPUTS = 8192
WIDE_MAX_ROWS = 256  # a decode step of beams (4 x 64 sequences) scores this many rows
# ACTIVATIONS' names -> oneDNN's post-op and its algorithm
FUSED_ACTIVATIONS = {"gelu": ("gelu", [], "none"), "gelu_tanh": ("gelu", [], "tanh"), "relu": ("relu", [], ""),
                     "silu": ("swish", [], "")}


class OneDnnLayerOps(TorchLayerOps):
    name = "onednn"

    def __init__(self):
        # id(weight) -> (the weight, weakly; its data pointer, version and dtype when packed; the packed copy, or
        # None where it cannot be packed). By identity: tensors compare elementwise, so no dict of them by value.
        self._packed: dict[int, tuple[weakref.ref, tuple, torch.Tensor | None]] = {}

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        if device.type != "cpu":
            return "runs on the CPU only"
        if not torch.backends.mkldnn.is_available():
            return "needs a PyTorch built with oneDNN (mkldnn)"
        return None

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed = self._packed_for(x, weight)
        if packed is None:
            return super().linear(x, weight, bias)
        return _packed_product(x, packed, bias, ("none", [], ""))

    def linear_act(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str) -> torch.Tensor:
        """With the activation applied by oneDNN as the product is written, where it has it."""
        packed = self._packed_for(x, weight) if activation in FUSED_ACTIVATIONS else None
        if packed is None:
            return ACTIVATIONS[activation](self.linear(x, weight, bias))
        return _packed_product(x, packed, bias, FUSED_ACTIVATIONS[activation])

    def _packed_for(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """The packed weight where `x` goes the packed way: the weight's dtype and no gradients; outside bfloat16
        also few rows, and on one thread without AVX-512 a wide output (limits measured in float32)."""
        if x.dtype != weight.dtype or torch.is_grad_enabled():
            return None
        if x.dtype != torch.bfloat16:
            wide = weight.shape[0] >= WIDE_OUTPUTS
            rows = x.numel() // max(x.shape[-1], 1)
            if rows > packed_max_rows(wide):
                return None
            if not wide and torch.get_num_threads() == 1 and not _has_avx512():
                return None
        return self._packed_weight(weight)

    def _packed_weight(self, weight: torch.Tensor) -> torch.Tensor | None:
        # an inference tensor keeps no version: only its replacement is seen (it may be changed only in inference)
        stamp = (weight.data_ptr(), -1 if weight.is_inference() else weight._version, weight.dtype)
        entry = self._packed.get(id(weight))
        if entry is None or entry[0]() is not weight or entry[1] != stamp:
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            except RuntimeError:  # a dtype this CPU's oneDNN has no kernel for
                packed = None
            key, packs = id(weight), self._packed
            entry = packs[key] = (weakref.ref(weight, lambda _: packs.pop(key, None)), stamp, packed)
        return entry[2]

    def is_packed(self, weight: torch.Tensor) -> bool:
        """Whether `weight` has a packed copy (it ran through oneDNN)."""
        entry = self._packed.get(id(weight))
        return entry is not None and entry[0]() is weight and entry[2] is not None


@functools.cache
def _has_avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


@functools.cache
def packed_max_rows(wide: bool = False) -> int:
    """The most rows a float32 product goes the packed way with; `wide`: into a vocabulary-wide output layer."""
    rows = PACKED_MAX_ROWS_AVX512 if _has_avx512() else PACKED_MAX_ROWS
    return max(WIDE_MAX_ROWS, rows) if wide else rows


@functools.cache
def _has_amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def padded_rows(rows: int) -> int:
    """The row count a bfloat16 product of `rows` rows runs at: itself up to 16, then the next multiple of 16 up to
    128 and of 1/8 of the power of two below it beyond (8 counts per doubling)."""
    if rows <= 16:
        return rows
    step = max(16, 1 << (rows.bit_length() - 4))
    return -(-rows // step) * step


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, post_op: tuple) -> torch.Tensor:
    rows = x.numel() // max(x.shape[-1], 1)
    padded = padded_rows(rows) if x.dtype == torch.bfloat16 and _has_amx() else rows
    if padded == rows:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, *post_op)
    out = torch.ops.mkldnn._linear_pointwise(_padded_input(x, rows, padded), packed, bias, *post_op)[:rows]
    return out.view(*x.shape[:-1], out.shape[-1])


def _padded_input(x: torch.Tensor, rows: int, padded: int) -> torch.Tensor:
    """`x` as (padded, features): a view where its storage runs on past its rows (the output of a padded product,
    as an MLP's second product takes its first's: a prompt chunk's 2,000 x 3,072 copy was 7% of its step), else a
    copy. Rows past x's are only read, and each output row depends on its own input row alone, so whatever they
    hold is cut off with them."""
    features = x.shape[-1]
    room = x.untyped_storage().nbytes() // x.element_size()
    if x.is_contiguous() and x.storage_offset() == 0 and room >= padded * features:
        return x.as_strided((padded, features), (features, 1))
    flat = x.new_empty(padded, features)
    flat[:rows] = x.reshape(rows, features)
    flat[rows:].zero_()  # only the padding: the rows themselves are overwritten
    return flat
