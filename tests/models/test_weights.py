"""Weights as checkpoints ship them: sharded or single-file; refused whole, with one clear
line, when a tensor is missing or in a dtype Quill cannot serve (float8, quantized)."""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from quill.models.loading.checkpoint import CheckpointError, load_checkpoint
from quill.models.loading.weights import PROGRESS_MIN_BYTES, WEIGHTS_INDEX_FILE, show_progress

LLAMA = "quill-test/tiny-llama-chat"  # the sharded one


@pytest.fixture
def llama_dir(offline_hub, tmp_path):
    """A writable copy of the sharded tiny Llama."""
    directory = tmp_path / "llama"
    shutil.copytree(offline_hub[LLAMA].path, directory)
    return directory


def index_of(directory) -> dict:
    return json.loads((directory / WEIGHTS_INDEX_FILE).read_text())


def test_sharded_checkpoint_spans_files_and_loads_exactly(offline_hub, llama_dir):
    weight_map = index_of(llama_dir)["weight_map"]
    assert len(set(weight_map.values())) >= 3
    # Some fused parameter of ours ([q; k; v] or [gate; up]) draws from two shards at once.
    fused = [[f"model.layers.{i}.self_attn.{x}_proj.weight" for x in "qkv"] for i in range(2)]
    fused += [[f"model.layers.{i}.mlp.{x}_proj.weight" for x in ("gate", "up")] for i in range(2)]
    assert any(len({weight_map[name] for name in parts}) > 1 for parts in fused)
    loaded = load_checkpoint(llama_dir, device="cpu", dtype="float32")
    tokens = torch.arange(20)[None]
    with torch.no_grad():
        expected = offline_hub[LLAMA].reference(tokens).logits
    torch.testing.assert_close(loaded.model(tokens), expected, atol=1e-4, rtol=0)


def test_missing_shard_is_named(llama_dir):
    shard = sorted(set(index_of(llama_dir)["weight_map"].values()))[1]
    (llama_dir / shard).unlink()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(llama_dir, device="cpu")
    assert shard in str(info.value) and "missing file" in str(info.value)


def test_index_naming_a_tensor_its_shard_lacks(llama_dir):
    index = index_of(llama_dir)
    name, shard = next((n, f) for n, f in index["weight_map"].items() if "down_proj" in n)
    tensors = load_file(llama_dir / shard)
    del tensors[name]
    save_file(tensors, llama_dir / shard, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(llama_dir, device="cpu")
    assert shard in str(info.value) and f"missing tensor {name!r}" in str(info.value)


def test_index_may_not_point_outside_the_checkpoint(llama_dir):
    index = index_of(llama_dir)
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../elsewhere.safetensors"
    (llama_dir / WEIGHTS_INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="is not a file of the checkpoint directory"):
        load_checkpoint(llama_dir, device="cpu")


def test_shards_linked_into_blobs_load(offline_hub, llama_dir, tmp_path):
    """The hub cache keeps a snapshot's files as links to blobs/<hash>: the links are the checkpoint's files."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for i, file in enumerate(sorted(llama_dir.iterdir())):
        if file.is_file():
            file.rename(blobs / str(i))
            file.symlink_to(blobs / str(i))
    loaded = load_checkpoint(llama_dir, device="cpu", dtype="float32")
    tokens = torch.arange(20)[None]
    with torch.no_grad():
        expected = offline_hub[LLAMA].reference(tokens).logits
    torch.testing.assert_close(loaded.model(tokens), expected, atol=1e-4, rtol=0)


def one_line_error(directory) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(directory, device="cpu")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("dtype, words", [
    (torch.float8_e4m3fn, "float8 (F8_E4M3)"), (torch.float8_e5m2, "float8 (F8_E5M2)"), (torch.int8, "integer (I8"),
])
def test_unservable_tensor_dtype_is_refused_before_loading(llama_dir, dtype, words):
    shard = sorted(set(index_of(llama_dir)["weight_map"].values()))[-1]
    tensors = load_file(llama_dir / shard)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, llama_dir / shard, metadata={"format": "pt"})
    message = one_line_error(llama_dir)
    assert shard in message and name in message and words in message
    assert "float32, float16 and bfloat16 weights only" in message


def test_quantized_checkpoint_is_refused(llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (llama_dir / "config.json").write_text(json.dumps(config))
    message = one_line_error(llama_dir)
    assert "config.json" in message and "quantized checkpoint" in message and "'gptq'" in message


def test_single_file_wins_over_an_index(llama_dir):
    """As in transformers: a stray index beside model.safetensors is not read."""
    tensors = {}
    for shard in sorted(set(index_of(llama_dir)["weight_map"].values())):
        tensors.update(load_file(llama_dir / shard))
        (llama_dir / shard).unlink()
    save_file(tensors, llama_dir / "model.safetensors", metadata={"format": "pt"})
    assert load_checkpoint(llama_dir, device="cpu").model.config.n_layers == 2


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal_and_for_big_checkpoints():
    assert show_progress(PROGRESS_MIN_BYTES, Terminal())
    assert not show_progress(PROGRESS_MIN_BYTES - 1, Terminal())
    assert not show_progress(10 * PROGRESS_MIN_BYTES, io.StringIO())
