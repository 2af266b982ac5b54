"""Every classic-checkpoint test converts into a cache of its own, never the user's."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def quill_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUILL_CACHE_DIR", str(tmp_path / "quill-cache"))
    return tmp_path / "quill-cache"
