"""Where a model's files are: a checkpoint directory, a model bundled with Quill, or a
Hugging Face hub id (`org/name`) found in the local Hugging Face cache.

The cache is the one `huggingface_hub` uses, read from the environment when a model is
looked up (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub). With
HF_HUB_OFFLINE set nothing is downloaded; otherwise a hub id missing from the cache is
fetched, only the files Quill reads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

BUNDLED_DIR = Path(__file__).parent / "checkpoints"  # the default models that ship with Quill

# What Quill reads of a snapshot: configs, tokenizer, weights and chat templates. Weights are
# model.safetensors or its shards only: never pickles, nor the duplicate consolidated.safetensors
# some repositories carry beside them.
HUB_FILES = ["*.json", "model*.safetensors", "*.jinja", "additional_chat_templates/*.jinja"]

# A repository id as the hub spells it: owner/name, letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class ModelLocation:
    path: Path  # the directory holding config.json and the rest
    model_id: str  # as it was asked for: a hub id, a bundled name or a directory
    revision: str | None = None  # the commit of a hub snapshot


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


def hub_snapshot(repo_id: str) -> Path:
    """The cached snapshot directory of `repo_id` (downloaded first unless offline)."""
    from huggingface_hub import snapshot_download  # only hub ids need it

    cache_dir, offline = hub_cache_dir(), hub_offline()
    repo_dir = cache_dir / f"models--{repo_id.replace('/', '--')}"
    missing = f"{repo_id} is not in the Hugging Face cache"
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=offline, allow_patterns=HUB_FILES))
    except (OSError, ValueError) as e:  # huggingface_hub's not-cached, not-found and network errors
        if offline:
            raise CheckpointError(repo_dir, f"{missing} (HF_HUB_OFFLINE is set, so nothing was downloaded)") from None
        raise CheckpointError(repo_dir, f"{missing} and could not be downloaded ({type(e).__name__}: {e})") from None


def locate(name_or_path: str | Path) -> ModelLocation:
    """A directory that exists, else a bundled model's name, else a hub id; anything else is
    returned as the path it names, for the loader to report as missing."""
    spec = str(name_or_path)
    path = Path(name_or_path)
    if path.exists():
        return ModelLocation(path, spec)
    if (BUNDLED_DIR / path).is_dir():
        return ModelLocation(BUNDLED_DIR / path, spec)
    if is_hub_id(spec):
        snapshot = hub_snapshot(spec)
        return ModelLocation(snapshot, spec, revision=snapshot.name)
    return ModelLocation(path, spec)
