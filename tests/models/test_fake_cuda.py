"""Every architecture's serving step on (fake) CUDA: no CPU tensor meets a CUDA one, in float32 and bfloat16.

The models are ours (LSTM, gated CNN, Transformer) and every Hugging Face family's configuration read by
quill/models/loading/hf.py, with fake weights on CUDA (tests/fake_cuda.py), stepping through the real batch and state
objects: paged K,V through the SDPA backend with the eager layer ops (Triton kernels need real memory).
What fake tensors cannot run: an LSTM prefill (pack_padded_sequence sizes its output from the lengths'
values), so LSTMs are stepped one token at a time here.
"""

from __future__ import annotations

import pytest
import torch

from quill.models.attention.triton_backend import TritonPagedAttention
from quill.models.batch import StepBatch
from quill.models.loading.hf import config_from_hf
from quill.models.loading.hf_families import FAMILIES
from quill.models.families.lstm import LSTMLanguageModel
from quill.models.families.registry import ARCHITECTURES
from tests.conftest import TINY_CONFIGS
from tests.fake_cuda import CUDA, assert_on_cuda, fake_cuda, fake_model, waiting_copies
from tests.models.test_incremental import BLOCK_SIZE, Cache

pytestmark = pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN")  # nn.LSTM on CUDA asks

V = 300
DTYPES = [torch.float32, torch.bfloat16]

_LLAMA_LIKE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
HF_CONFIGS = {
    "gpt2": dict(model_type="gpt2", vocab_size=V, n_embd=32, n_layer=1, n_head=4, n_positions=64),
    "llama": dict(model_type="llama", **_LLAMA_LIKE),
    "llama3-rope-scaling": dict(model_type="llama", **_LLAMA_LIKE, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)),
    "mistral": dict(model_type="mistral", **_LLAMA_LIKE),
    "qwen2": dict(model_type="qwen2", **_LLAMA_LIKE),
    "qwen3": dict(model_type="qwen3", **_LLAMA_LIKE),
    "phi3": dict(model_type="phi3", **_LLAMA_LIKE),
    "gemma": dict(model_type="gemma", **_LLAMA_LIKE),
    "mamba2": dict(model_type="mamba2", vocab_size=V, hidden_size=16, num_hidden_layers=1, num_heads=4, head_dim=8,
                   state_size=8, n_groups=2, chunk_size=4),
    "xlstm": dict(model_type="xlstm", vocab_size=V, hidden_size=64, num_blocks=1, num_heads=4, chunk_size=4),
}


def model_spec(key: str) -> tuple[type, object]:
    """(model class, config) of a TINY_CONFIGS key or an "hf-" + HF_CONFIGS key."""
    if key.startswith("hf-"):
        raw = HF_CONFIGS[key.removeprefix("hf-")]
        return ARCHITECTURES[FAMILIES[raw["model_type"]].architecture][1], config_from_hf(raw)[0]
    arch, kwargs = TINY_CONFIGS[key]
    config_cls, model_cls = ARCHITECTURES[arch]
    return model_cls, config_cls(vocab_size=V, **kwargs)


def test_every_hugging_face_family_is_covered():
    """Every family read as a Transformer, and some others; the rest have fake-CUDA tests of their own
    (tests/models/test_<arch>)."""
    read_as_transformer = {name for name, family in FAMILIES.items() if family.architecture == "transformer"}
    assert read_as_transformer <= {c["model_type"] for c in HF_CONFIGS.values()} <= set(FAMILIES)


# Our models in both dtypes; the Hugging Face families as CUDA serves them by default (bfloat16).
CASES = [(key, dtype) for key in TINY_CONFIGS for dtype in DTYPES] + [(f"hf-{k}", torch.bfloat16) for k in HF_CONFIGS]


@pytest.mark.parametrize("key, dtype", CASES, ids=[f"{k}-{str(d).removeprefix('torch.')}" for k, d in CASES])
def test_prefill_decode_and_fork_stay_on_cuda(key, dtype):
    with fake_cuda():
        model = fake_model(*model_spec(key), dtype)
        cache = Cache(model, 3, device=CUDA)
        state = cache.state
        assert_on_cuda(*(state.k, state.v) if cache.paged else state.tensors.values())
        if not isinstance(model, LSTMLanguageModel):  # see the module's docstring
            # A whole prompt, the first chunk of another and one token of a third, scored at every position.
            outs = cache.run([0, 1, 2], [[5, 6, 7, 8, 9], [10, 11, 12], [13]], logits="all")
            assert [o.shape for o in outs] == [(5, V), (3, V), (1, V)]
            assert_on_cuda(*outs)
        # Sequence 2 forks from sequence 0 (block copy-on-write, slot copy) and the slot of 1 is reset.
        if cache.paged:
            state.copy_blocks([cache.tables[0][1]], [cache.tables[2][1]])
        else:
            state.copy([0], [2])
            state.reset([1])
        # A decode-only step (one row per sequence: the path CUDA graphs capture).
        outs = cache.run([0, 1, 2], [[20], [21], [22]], logits="last")
        assert_on_cuda(*outs)
        assert all(o.shape == (1, V) and o.dtype == torch.float32 for o in outs)


@pytest.mark.parametrize("key", TINY_CONFIGS)
def test_full_forward_on_cuda(key):
    with fake_cuda():
        model = fake_model(*model_spec(key))
        logits = model(torch.zeros(2, 7, dtype=torch.long, device=CUDA))
        assert_on_cuda(logits)
        assert logits.shape == (2, 7, V)


@pytest.mark.parametrize("query_lens", [[5, 3, 1], [1, 1, 1]], ids=["mixed", "decode"])
def test_triton_backend_builds_its_step_metadata_on_cuda(query_lens):
    """Only the metadata: the kernel itself needs real memory (tests/models/attention run it in the interpreter)."""
    with fake_cuda():
        tables = [[0, 1], [2, 3], [4]]
        batch = StepBatch.build([[7] * n for n in query_lens], [0, 0, 3], block_tables=tables, device=CUDA)
        with waiting_copies() as waiting:  # a copy that waits for the GPU would stall the host every prefill step
            meta = TritonPagedAttention.build(batch, BLOCK_SIZE)
        assert waiting == []
        assert_on_cuda(meta.slot_mapping, meta.positions, meta.block_tables, meta.seq_starts, meta.tile_seqs,
                       meta.tile_starts)
        assert meta.seq_starts.dtype == meta.tile_seqs.dtype == torch.int32
