"""A classic checkpoint given as it is converts once, into a directory keyed by the bytes it was read from."""

from __future__ import annotations

from quill.models.classic.cache import converted_checkpoint
from quill.models.loading.location import locate
from tests.models.classic.wlm_checkpoints import build_rnn_model, save_whole, write_corpus


def test_converted_once_and_again_when_a_file_changes(tmp_path, quill_cache):
    directory = write_corpus(tmp_path / "run")
    save_whole(build_rnn_model(tmp_path / "code", "LSTM"), directory / "model.pt")
    first = converted_checkpoint(directory)
    assert first.parent == quill_cache / "classic" and (first / "config.json").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert converted_checkpoint(directory / "model.pt") == first  # the file or its directory: same inputs
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    with open(directory / "test.txt", "a") as f:
        f.write("\n")  # one more <eos>: same vocabulary, other bytes
    assert converted_checkpoint(directory) != first
    location = locate(str(directory))
    assert location.converted and location.model_id == str(directory) and location.path.parent == first.parent


def test_quill_checkpoints_and_other_paths_are_not_classic(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert converted_checkpoint(tmp_path / "notes.txt") is None
    assert converted_checkpoint(tmp_path) is None
    assert not locate(str(tmp_path)).converted
