"""Models are found by directory, bundled name, or hub id in the local Hugging Face cache."""

from __future__ import annotations

import pytest

from quill.models.loading.checkpoint import CheckpointError, load_checkpoint
from quill.models.loading.location import BUNDLED_DIR, HUB_FILES, hub_cache_dir, is_hub_id, locate
from tests.hub_checkpoints import COMMIT, snapshot_dir

LLAMA = "quill-test/tiny-llama-chat"


def test_hub_id_loads_from_the_cache_offline(offline_hub, hub_cache):
    loaded = load_checkpoint(LLAMA, device="cpu")
    assert loaded.path == snapshot_dir(hub_cache[0], LLAMA)
    assert (loaded.name, loaded.model_id, loaded.revision) == (LLAMA, LLAMA, COMMIT)


def test_hf_home_is_honoured(hub_cache, monkeypatch, tmp_path):
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "hub").symlink_to(hub_cache[0])
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_cache_dir() == home / "hub"
    assert locate(LLAMA).revision == COMMIT


def test_hub_id_missing_from_the_cache_says_where_it_looked(offline_hub, hub_cache):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint("quill-test/not-downloaded", device="cpu")
    message = str(info.value)
    assert str(hub_cache[0] / "models--quill-test--not-downloaded") in message
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE" in message
    assert "\n" not in message


def test_online_a_hub_id_is_fetched_and_a_failure_says_so(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def unreachable(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        raise huggingface_hub.errors.LocalEntryNotFoundError("connection refused")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(CheckpointError) as info:
        locate("org/model")
    assert calls == [("org/model", dict(revision=None, cache_dir=tmp_path, local_files_only=False,
                                        allow_patterns=HUB_FILES))]
    assert str(tmp_path / "models--org--model") in str(info.value)
    assert "could not be downloaded (LocalEntryNotFoundError: connection refused)" in str(info.value)


def test_directory_and_bundled_name_still_work(offline_hub, hub_cache):
    snapshot = snapshot_dir(hub_cache[0], LLAMA)
    by_path = locate(str(snapshot))
    assert (by_path.path, by_path.model_id, by_path.revision) == (snapshot, str(snapshot), None)
    assert load_checkpoint(snapshot, device="cpu").name == COMMIT  # a directory is named after itself
    bundled = locate("shakespeare-lstm")
    assert bundled.path == BUNDLED_DIR / "shakespeare-lstm" and bundled.model_id == "shakespeare-lstm"


def test_what_counts_as_a_hub_id(tmp_path, monkeypatch):
    assert is_hub_id("meta-llama/Llama-3.1-8B-Instruct") and is_hub_id("Qwen/Qwen2.5-0.5B")
    for not_an_id in ("shakespeare-lstm", "/abs/path", "./rel/path", "a/b/c", "../x", "org/..", "org/"):
        assert not is_hub_id(not_an_id), not_an_id
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_id("org/name")  # an existing directory wins
