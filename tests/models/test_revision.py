"""A hub id is read at a revision: a branch or tag of the cache's refs/, a full commit, or a prefix
only one cached commit starts with; one the cache lacks is refused with the revisions it holds."""

from __future__ import annotations

import pytest

from quill.models.loading.checkpoint import CheckpointError, load_checkpoint
from quill.models.loading.location import HUB_FILES, locate
from quill.cli import main
from tests.hub_checkpoints import snapshot_dir, write_revisions

REPO = "quill-test/revisions"
MAIN, TAG, PR = "1" * 40, "2" * 40, "3" * 40
LOOSE, TWIN = "abcd0" + "4" * 35, "abcd9" + "5" * 35  # no ref names them; they share the prefix abcd
STALE = "e" * 40  # a ref whose snapshot was deleted
TEMPERATURES = {MAIN: 0.1, TAG: 0.2, PR: 0.3, LOOSE: 0.4, TWIN: 0.5}
REFS = {"main": MAIN, "v1.0": TAG, "pr/1": PR, "stale": STALE}


@pytest.fixture
def revision_cache(hub_cache, tmp_path, monkeypatch):
    """REPO at five commits in an offline hub cache of its own."""
    cache = tmp_path / "hub"
    write_revisions(cache, REPO, snapshot_dir(hub_cache[0], "quill-test/tiny-llama-chat"), TEMPERATURES, REFS)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.mark.parametrize("revision, commit", [
    (None, MAIN), ("main", MAIN), ("v1.0", TAG), ("pr/1", PR),  # branches and tags, nested ones too
    (LOOSE, LOOSE), ("abcd9", TWIN), (TAG[:7], TAG),  # a commit in full, or a prefix only it starts with
])
def test_a_revision_picks_its_snapshot(revision_cache, revision, commit):
    location = locate(REPO, revision)
    assert (location.path, location.revision) == (snapshot_dir(revision_cache, REPO, commit), commit)


def test_the_loaded_model_is_the_snapshot_asked_for(revision_cache):
    loaded = load_checkpoint(REPO, device="cpu", dtype="float32", revision="v1.0", weights=False)
    assert (loaded.model_id, loaded.revision, loaded.generation_defaults) == (REPO, TAG, {"temperature": 0.2})
    assert load_checkpoint(REPO, device="cpu", weights=False).generation_defaults == {"temperature": 0.1}


def test_a_located_model_is_read_where_it_was_found(revision_cache):
    """What another process located is loaded as it is: v1.0 is not looked up again after it moved."""
    location = locate(REPO, "v1.0")
    (revision_cache / "models--quill-test--revisions" / "refs" / "v1.0").write_text(PR)
    loaded = load_checkpoint(location, device="cpu", weights=False)
    assert (loaded.model_id, loaded.revision, loaded.generation_defaults) == (REPO, TAG, {"temperature": 0.2})
    with pytest.raises(ValueError, match="already located"):
        load_checkpoint(location, device="cpu", weights=False, revision="v1.0")


def test_a_revision_the_cache_lacks_lists_the_cached_ones(revision_cache):
    with pytest.raises(CheckpointError) as info:
        locate(REPO, "v2.0")
    message = str(info.value)
    assert message.startswith(f"{revision_cache / 'models--quill-test--revisions'}: revision v2.0 of {REPO} is not "
                              "in the Hugging Face cache")
    assert ("cached revisions: main (111111111111), pr/1 (333333333333), stale (eeeeeeeeeeee, its snapshot missing), "
            "v1.0 (222222222222), abcd04444444, abcd95555555") in message
    assert "HF_HUB_OFFLINE" in message and "\n" not in message
    with pytest.raises(CheckpointError, match="revision stale of .* its snapshot missing"):
        locate(REPO, "stale")


def test_main_missing_is_reported_with_what_is_cached(revision_cache):
    (revision_cache / "models--quill-test--revisions" / "refs" / "main").unlink()
    with pytest.raises(CheckpointError, match=r"revision main of quill-test/revisions is not in the Hugging Face "
                                              r"cache \(cached revisions: pr/1 \(333333333333\)"):
        locate(REPO)


def test_an_ambiguous_prefix_names_the_commits_it_matches(revision_cache):
    with pytest.raises(CheckpointError, match=f"revision abcd is ambiguous: cached commits {LOOSE}, {TWIN}"):
        locate(REPO, "abcd")


def test_a_branch_wins_over_a_commit_prefix_it_spells(revision_cache):
    refs = revision_cache / "models--quill-test--revisions" / "refs"
    (refs / "abcd9").write_text(TAG)
    assert locate(REPO, "abcd9").revision == TAG


@pytest.mark.parametrize("revision", ["", "../../etc", "v1/../main", "/main", "main/", "a b", "x=y"])
def test_a_malformed_revision_is_refused(revision_cache, revision):
    with pytest.raises(ValueError, match="is not a branch, tag or commit name"):
        locate(REPO, revision)


def test_only_hub_ids_have_revisions(revision_cache, tmp_path):
    for not_a_hub_id in ("shakespeare-lstm", str(tmp_path)):
        with pytest.raises(ValueError, match=f"but {not_a_hub_id} is not a Hugging Face hub id"):
            locate(not_a_hub_id, "main")


def test_online_the_revision_is_asked_of_the_hub_with_a_cached_prefix_expanded(revision_cache, monkeypatch):
    import huggingface_hub

    calls = []

    def fetched(repo_id, **kwargs):
        calls.append(kwargs["revision"])
        return str(snapshot_dir(revision_cache, repo_id, kwargs["revision"] or MAIN))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetched)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for revision in ("v1.0", "abcd0", None):
        locate(REPO, revision)
    assert calls == ["v1.0", LOOSE, None]


def test_online_a_failed_download_names_the_revision_and_the_cached_ones(revision_cache, monkeypatch):
    import huggingface_hub

    def unreachable(repo_id, **kwargs):
        assert kwargs == dict(revision="v2.0", cache_dir=revision_cache, local_files_only=False,
                              allow_patterns=HUB_FILES)
        raise huggingface_hub.errors.LocalEntryNotFoundError("connection refused")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(CheckpointError) as info:
        locate(REPO, "v2.0")
    assert "revision v2.0 of quill-test/revisions is not in the Hugging Face cache (cached revisions: main" in str(
        info.value)
    assert str(info.value).endswith("could not be downloaded (LocalEntryNotFoundError: connection refused)")


def test_quill_generate_takes_a_revision(revision_cache, capsys):
    def generate(*flags) -> int:
        return main(["generate", "To be", "--model", REPO, "--max-tokens", "3", "--temperature", "0",
                     "--device", "cpu", *flags])

    assert generate("--revision", "v1.0") == 0 and capsys.readouterr().out.startswith("To be")
    assert generate("--revision", "v9") == 2
    error = capsys.readouterr().err
    assert error.startswith("quill generate: error: ") and "revision v9 of" in error and "cached revisions: main" in error
