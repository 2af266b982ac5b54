"""The table of state sizes in docs/models.md comes from the models' own state tensors."""

from __future__ import annotations

import torch

from benchmarks.state_sizes import CHECKPOINTS, markdown, state_size


def test_sizes_are_the_engines_own_allocations():
    mamba = state_size(CHECKPOINTS["state-spaces/mamba-130m-hf"], torch.bfloat16)
    # 24 layers x 1536 channels x (3 bfloat16 inputs of the conv window + 16 float32 SSM entries)
    assert mamba["state_bytes"] == 24 * 1536 * (3 * 2 + 16 * 4) and mamba["kv_bytes_per_token"] == 0
    xlstm = state_size(CHECKPOINTS["NX-AI/xLSTM-7b"], torch.bfloat16)
    assert xlstm["state_bytes"] == 32 * 8 * (256 * 512 + 256 + 1) * 4  # C, n, m of 8 heads in 32 blocks, float32
    lfm2 = state_size(CHECKPOINTS["LiquidAI/LFM2-350M"], torch.bfloat16)
    assert lfm2["state_bytes"] == 10 * 2 * 1024 * 2  # 10 conv layers' last two inputs
    assert lfm2["kv_bytes_per_token"] == 6 * 2 * 8 * 64 * 2  # 6 attention layers' K and V
    assert markdown(torch.bfloat16).count("\n") == len(CHECKPOINTS) + 1
