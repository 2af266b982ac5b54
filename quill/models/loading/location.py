"""Where a model's files are: a checkpoint directory, a model bundled with Quill, a Hugging Face hub id
(`org/name`) found in the local Hugging Face cache, or a classic toolkit's checkpoint (a model file, or
the directory of its original files), converted once into a Quill checkpoint (quill/models/classic/cache.py).

The cache is the one `huggingface_hub` uses, read from the environment when a model is
looked up (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub). With
HF_HUB_OFFLINE set nothing is downloaded; otherwise a hub id missing from the cache is
fetched, only the files Quill reads.

A hub id is read at a revision: the branch or tag the cache's refs/<name> file points at
(main unless asked otherwise), or a commit, in full or as a prefix only one cached snapshot
starts with.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

BUNDLED_DIR = Path(__file__).parent.parent / "checkpoints"  # the default models that ship with Quill

# What Quill reads of a snapshot: configs, tokenizer, weights and chat templates. Weights are
# model.safetensors or its shards only: never pickles, nor the duplicate consolidated.safetensors
# some repositories carry beside them.
HUB_FILES = ["*.json", "model*.safetensors", "*.jinja", "additional_chat_templates/*.jinja"]

# A repository id as the hub spells it: owner/name, letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_TRUE = {"1", "ON", "YES", "TRUE"}
# A branch, tag or commit as the hub names them: path segments of letters, digits, '-', '_', '.', never "..".
_REVISION = re.compile(r"^[\w.-]+(?:/[\w.-]+)*$")
_COMMIT_PREFIX = re.compile(r"^[0-9a-f]{4,40}$")  # git's shortest abbreviation is 4 hex digits
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class ModelLocation:
    path: Path  # the directory holding config.json and the rest
    model_id: str  # as it was asked for: a hub id, a bundled name or a directory
    revision: str | None = None  # the commit of a hub snapshot
    converted: bool = False  # path is the conversion of a classic checkpoint (model_id names the original)


def is_hub_id(name: str) -> bool:
    """`org/name` that is not a path on this machine."""
    return bool(_HUB_ID.match(name)) and ".." not in name and not Path(name).exists()


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as huggingface_hub reads it."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(env.get("HF_HOME") or os.path.join(xdg, "huggingface")).expanduser() / "hub"


def hub_offline() -> bool:
    env = os.environ
    return (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").upper() in _TRUE


def check_revision(revision: str) -> None:
    """A revision that can name a branch, tag or commit (so never a path out of the cache)."""
    if not _REVISION.match(revision) or ".." in revision.split("/"):
        raise ValueError(f"revision {revision!r} is not a branch, tag or commit name")


def cached_revisions(repo_dir: Path) -> tuple[dict[str, str], list[str]]:
    """What the cache holds of one repository: {branch or tag: commit} from refs/, and the commits
    of its snapshots."""
    refs_dir, snapshots_dir = repo_dir / "refs", repo_dir / "snapshots"
    refs = {ref.relative_to(refs_dir).as_posix(): ref.read_text().strip()
            for ref in sorted(refs_dir.rglob("*")) if ref.is_file()} if refs_dir.is_dir() else {}
    commits = sorted(s.name for s in snapshots_dir.iterdir() if s.is_dir()) if snapshots_dir.is_dir() else []
    return refs, commits


def describe_cached(repo_dir: Path) -> str:
    """The revisions a request may name, for an error: each ref with its commit, then commits no ref names."""
    refs, commits = cached_revisions(repo_dir)
    named = [f"{ref} ({commit[:12]}{'' if commit in commits else ', its snapshot missing'})"
             for ref, commit in refs.items()]
    unnamed = [commit[:12] for commit in commits if commit not in refs.values()]
    return ", ".join(named + unnamed) or "none"


def expand_commit_prefix(repo_dir: Path, revision: str) -> str:
    """The full commit of the one cached snapshot whose commit starts with `revision`; otherwise
    `revision` as it is (a branch or tag, a full commit, or something the cache does not hold)."""
    if (repo_dir / "refs" / revision).is_file() or not _COMMIT_PREFIX.match(revision):
        return revision  # a branch or tag wins over a commit it happens to spell, as in git
    matches = [commit for commit in cached_revisions(repo_dir)[1] if commit.startswith(revision)]
    if len(matches) > 1:
        raise CheckpointError(repo_dir, f"revision {revision} is ambiguous: cached commits {', '.join(matches)} "
                                        "all start with it")
    return matches[0] if matches else revision


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The cached snapshot directory of `repo_id` at `revision` (None: main), downloaded first unless offline."""
    from huggingface_hub import snapshot_download  # only hub ids need it

    cache_dir, offline = hub_cache_dir(), hub_offline()
    repo_dir = cache_dir / f"models--{repo_id.replace('/', '--')}"
    if revision is not None:
        check_revision(revision)
        revision = expand_commit_prefix(repo_dir, revision)
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=offline,
                                      allow_patterns=HUB_FILES))
    except (OSError, ValueError) as e:  # huggingface_hub's not-cached, not-found and network errors
        if repo_dir.is_dir():  # the repository is cached, the revision is not: say which ones are
            missing = (f"revision {revision or DEFAULT_REVISION} of {repo_id} is not in the Hugging Face cache "
                       f"(cached revisions: {describe_cached(repo_dir)})")
        else:
            missing = f"{repo_id} is not in the Hugging Face cache"
        if offline:
            raise CheckpointError(repo_dir, f"{missing} (HF_HUB_OFFLINE is set, so nothing was downloaded)") from None
        raise CheckpointError(repo_dir, f"{missing} and could not be downloaded ({type(e).__name__}: {e})") from None


def locate(name_or_path: str | Path, revision: str | None = None) -> ModelLocation:
    """A directory that exists, else a bundled model's name, else a hub id (at `revision`: a branch,
    tag or commit; None: main); anything else is returned as the path it names, for the loader to
    report as missing. Only a hub id has revisions."""
    spec = str(name_or_path)
    path = Path(name_or_path)
    if is_hub_id(spec):
        snapshot = hub_snapshot(spec, revision)
        return ModelLocation(snapshot, spec, revision=snapshot.name)
    if revision is not None:
        raise ValueError(f"revision {revision} was asked for, but {spec} is not a Hugging Face hub id (only hub "
                         "ids have revisions)")
    if path.is_file() or (path.is_dir() and not (path / "config.json").exists()):
        from ..classic.cache import converted_checkpoint  # loads the classic formats only for such paths

        converted = converted_checkpoint(path)
        if converted is not None:
            return ModelLocation(converted, spec, converted=True)
    if path.exists():
        return ModelLocation(path, spec)
    if (BUNDLED_DIR / path).is_dir():
        return ModelLocation(BUNDLED_DIR / path, spec)
    return ModelLocation(path, spec)
