"""The state-space, xLSTM and LFM2 families load by hub id from the local Hugging Face cache, sharded as the hub ships
large checkpoints, and give transformers' logits."""

from __future__ import annotations

import importlib

import pytest
import torch

from quill.models.loading.checkpoint import load_checkpoint
from tests.hf_state_models import VOCAB
from tests.hub_checkpoints import COMMIT, new_snapshot

FAMILIES = {"mamba": {}, "falcon_mamba": {"model_type": "falcon_mamba"}, "mamba2": {}, "xlstm": {}, "lfm2": {}}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_loads_sharded_by_hub_id(family, tmp_path, monkeypatch):
    repo_id = f"quill-test/tiny-{family.replace('_', '-')}"
    snapshot = new_snapshot(tmp_path, repo_id)
    module = importlib.import_module(f"tests.hf_state_models.{family.removeprefix('falcon_')}")
    reference = module.save_tiny(snapshot, **FAMILIES[family])
    reference.save_pretrained(snapshot, max_shard_size="20KB")  # shards and their index, as large checkpoints come
    (snapshot / "model.safetensors").unlink(missing_ok=True)
    assert (snapshot / "model.safetensors.index.json").is_file()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_checkpoint(repo_id, device="cpu", dtype="float32")
    assert loaded.name == repo_id and loaded.revision == COMMIT
    assert loaded.architecture == family.removeprefix("falcon_")
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(tokens).logits
    torch.testing.assert_close(loaded.model(tokens), want, atol=2e-4, rtol=0)
