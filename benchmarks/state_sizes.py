"""What each sequence of the released state-space, xLSTM and LFM2 checkpoints holds in Quill's cache.

    python -m benchmarks.state_sizes              # a Markdown table, as docs/models.md's
    python -m benchmarks.state_sizes --dtype float32

Each model is built on the meta device from the shape its config.json gives (the keys that set the state's size,
copied from the released configs below; nothing is downloaded), and its state for one sequence is allocated
there too: the bytes are those the engine reserves, read from the tensors, not worked out by hand. Weights in
bfloat16 by default (how CUDA serves them); SSM and xLSTM states stay float32 whatever the weights.
"""

from __future__ import annotations

import argparse

import torch

from quill.models.loading.hf import config_from_hf, family_of
from quill.models.families.registry import ARCHITECTURES
from quill.models.state import new_model_state, state_parts

_MAMBA = dict(model_type="mamba", vocab_size=50280, state_size=16, expand=2, conv_kernel=4)
_MAMBA2 = dict(model_type="mamba2", head_dim=64, state_size=128, expand=2, conv_kernel=4, n_groups=1)
_LFM2 = dict(model_type="lfm2", vocab_size=65536, num_hidden_layers=16, num_key_value_heads=8, conv_L_cache=3,
             full_attn_idxs=[2, 5, 8, 10, 12, 14], max_position_embeddings=128000)
CHECKPOINTS = {  # hub id -> the config.json keys that size the model and its state
    "state-spaces/mamba-130m-hf": dict(_MAMBA, hidden_size=768, num_hidden_layers=24),
    "state-spaces/mamba-370m-hf": dict(_MAMBA, hidden_size=1024, num_hidden_layers=48),
    "state-spaces/mamba-790m-hf": dict(_MAMBA, hidden_size=1536, num_hidden_layers=48),
    "state-spaces/mamba-1.4b-hf": dict(_MAMBA, hidden_size=2048, num_hidden_layers=48),
    "state-spaces/mamba-2.8b-hf": dict(_MAMBA, hidden_size=2560, num_hidden_layers=64),
    "tiiuae/falcon-mamba-7b": dict(_MAMBA, model_type="falcon_mamba", vocab_size=65024, hidden_size=4096,
                                   num_hidden_layers=64, expand=16, intermediate_size=8192),
    "state-spaces/mamba2-130m": dict(_MAMBA2, vocab_size=50288, hidden_size=768, num_hidden_layers=24,
                                     num_heads=24, tie_word_embeddings=True),
    "state-spaces/mamba2-2.7b": dict(_MAMBA2, vocab_size=50288, hidden_size=2560, num_hidden_layers=64,
                                     num_heads=80, tie_word_embeddings=True),
    "mistralai/Mamba-Codestral-7B-v0.1": dict(_MAMBA2, vocab_size=32768, hidden_size=4096, num_hidden_layers=64,
                                              num_heads=128, n_groups=8),
    "NX-AI/xLSTM-7b": dict(model_type="xlstm", vocab_size=50304, hidden_size=4096, embedding_dim=4096,
                           num_blocks=32, num_heads=8),
    "LiquidAI/LFM2-350M": dict(_LFM2, hidden_size=1024, num_attention_heads=16, intermediate_size=6656),
    "LiquidAI/LFM2-700M": dict(_LFM2, hidden_size=1536, num_attention_heads=24, intermediate_size=10240),
    "LiquidAI/LFM2-1.2B": dict(_LFM2, hidden_size=2048, num_attention_heads=32, intermediate_size=12288),
}


def state_size(raw: dict, dtype: torch.dtype, block_size: int = 16) -> dict:
    """Bytes one sequence holds: its fixed-size state, and K,V per token where the model has attention layers."""
    config, _ = config_from_hf(raw)
    _, model_cls = ARCHITECTURES[family_of(raw).architecture]
    with torch.device("meta"):
        model = model_cls(config).to(dtype)
        parameters = sum(p.numel() for p in model.parameters())
        kv, slots = state_parts(new_model_state(model, 1, 1, block_size))
        fixed, per_token = slots.bytes_per_slot, 0 if kv is None else kv.bytes_per_token
    return {"family": raw["model_type"], "parameters": parameters, "state_bytes": fixed,
            "kv_bytes_per_token": per_token}


def _bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def markdown(dtype: torch.dtype) -> str:
    lines = ["| checkpoint | family | parameters | state per sequence | K,V per token |",
             "| --- | --- | --- | --- | --- |"]
    for hub_id, raw in CHECKPOINTS.items():
        size = state_size(raw, dtype)
        kv = _bytes(size["kv_bytes_per_token"]) if size["kv_bytes_per_token"] else "none"
        lines.append(f"| `{hub_id}` | {size['family']} | {size['parameters'] / 1e9:.2f} B | "
                     f"{_bytes(size['state_bytes'])} | {kv} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_sizes", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="the weights' dtype (default bfloat16)")
    args = parser.parse_args(argv)
    print(markdown(getattr(torch, args.dtype)))


if __name__ == "__main__":
    main()
