"""Layer ops: the registry's choices, and whole Transformer steps equal through fused kernels and eager torch.

The models run their steps through the reference ("torch") ops and through the fused Triton ops on
the same weights and caches (attention through SDPA for both, so only the layer ops differ): the
logits agree within the dtype's tolerance and greedy decoding picks the same tokens.
"""

from __future__ import annotations

import pytest
import torch

from quill.models.batch import StepBatch
from quill.models.kernels import TORCH_OPS, select_layer_ops
from quill.models.families.registry import ARCHITECTURES
from tests.conftest import KERNEL_DEVICE, build_tiny_model

V = 300


def test_auto_is_onednn_on_the_cpu_and_models_start_with_torch():
    assert select_layer_ops("auto", "cpu").name == "onednn"
    _, model = build_tiny_model("transformer-llama", V, device="cpu")
    assert model.layer_ops is TORCH_OPS


def test_load_checkpoint_chooses_the_layer_ops(tmp_path, tiny_tokenizer):
    from quill.models.loading.checkpoint import load_checkpoint, save_checkpoint

    arch, model = build_tiny_model("transformer-llama", tiny_tokenizer.vocab_size, device="cpu")
    path = save_checkpoint(tmp_path, arch, model, tiny_tokenizer, dtype=torch.float32)
    assert load_checkpoint(path, device="cpu").model.layer_ops.name == "onednn"
    assert load_checkpoint(path, device="cpu", layer_ops="torch").model.layer_ops.name == "torch"
    with pytest.raises(ValueError, match="auto or one of torch, triton, onednn, not 'compiled'"):
        load_checkpoint(path, device="cpu", layer_ops="compiled")


def test_triton_is_refused_on_the_cpu_outside_the_interpreter(monkeypatch):
    pytest.importorskip("triton", reason="needs the triton package")
    from quill.models.kernels import triton_ops

    monkeypatch.setattr(triton_ops, "is_interpreted", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        select_layer_ops("triton", "cpu")


def test_the_serve_flag_reaches_the_server_config():
    import argparse

    from quill.server.config import add_serve_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert config_from_args(parser.parse_args([])).layer_ops == "auto"
    assert config_from_args(parser.parse_args(["--layer-ops", "torch"])).layer_ops == "torch"
    with pytest.raises(SystemExit):
        parser.parse_args(["--layer-ops", "fast"])


# Llama: RMSNorm, RoPE, SwiGLU, grouped-query heads. Gemma-like: (1 + w) RMSNorm, GeGLU (tanh), q/k norms
# (Qwen3), Llama-3 RoPE rescaling, odd widths.
GEMMA_LIKE = dict(d_model=36, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=10, d_ff=50, norm="rmsnorm_unit_offset",
                  activation="gelu_tanh", qk_norm=True, embed_scale=6.0, rope_scaling=dict(
                      rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16))
# The original Transformer's layout (post-norm, sinusoidal positions, ReLU MLP) with RMSNorm, which the fused
# add_norm kernel covers: norm(x + h) is its first result, the post-norm residual.
POST_NORM = dict(d_model=32, n_layers=2, n_heads=4, positional="sinusoidal", post_norm=True, final_norm=False,
                 gated_mlp=False, activation="relu", attn_bias=True, mlp_bias=True, output_bias=True)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}
CASES = [("llama", torch.float32), ("llama", torch.float16), ("gemma-like", torch.float32),
         ("post-norm", torch.float32)]
if KERNEL_DEVICE.type == "cuda":
    CASES += [("llama", torch.bfloat16), ("gemma-like", torch.bfloat16)]


def build(key: str, dtype: torch.dtype):
    if key == "llama":
        _, model = build_tiny_model("transformer-llama", V, device="cpu")
    else:
        config_cls, model_cls = ARCHITECTURES["transformer"]
        torch.manual_seed(0)
        model = model_cls(config_cls(vocab_size=V, **(GEMMA_LIKE if key == "gemma-like" else POST_NORM))).eval()
        with torch.no_grad():  # norms start as the identity (unit-offset ones at zero): give them weights to check
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.3)
    return model.to(KERNEL_DEVICE, dtype)


@pytest.mark.parametrize(("key", "dtype"), CASES, ids=lambda x: str(x).removeprefix("torch."))
def test_transformer_steps_through_fused_ops_equal_torch(key, dtype):
    pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")
    model = build(key, dtype)
    ops = {"torch": TORCH_OPS, "triton": select_layer_ops("triton", KERNEL_DEVICE)}
    states = {name: model.new_state(24, block_size=4, attention_backend="sdpa") for name in ops}
    tables = [[3, 17, 8, 20, 21], [12, 5, 1, 9], [2, 14, 6]]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (7, 1, 5)]
    new, lengths = prompts, [0, 0, 0]
    tokens = {name: [] for name in ops}
    for _ in range(6):  # a prefill of the three prompts, then greedy decodes
        batch = StepBatch.build(new, lengths, block_tables=tables, device=KERNEL_DEVICE)
        logits = {}
        for name, state in states.items():
            model.layer_ops = ops[name]
            logits[name] = model.step(batch, state)  # (3, V)
            tokens[name].append(logits[name].argmax(-1).tolist())
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(logits["triton"], logits["torch"], atol=tol, rtol=tol)
        lengths = [n + len(t) for n, t in zip(lengths, new)]
        new = [[t] for t in tokens["torch"][-1]]
    assert tokens["triton"] == tokens["torch"]

