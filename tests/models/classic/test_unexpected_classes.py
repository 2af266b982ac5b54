"""A classic checkpoint that names a class its format does not expect is refused, and nothing of it runs."""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager

import pytest

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.classic.conversion import convert
from quill.models.loading.errors import CheckpointError
from tests.models.classic.wlm_checkpoints import build_rnn_model, save_whole, write_corpus

EVIL_PY = '''
import os


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
'''


@contextmanager
def module_from(code_dir, name: str, source: str):
    """`name` importable from `code_dir` while the block runs (pickling looks the class up), forgotten after."""
    (code_dir / f"{name}.py").write_text(source)
    sys.path.insert(0, str(code_dir))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(code_dir))
        sys.modules.pop(name, None)


def test_a_payload_class_is_refused_by_name_and_never_runs(tmp_path, quill_cache):
    marker = tmp_path / "payload-ran"
    model = build_rnn_model(tmp_path / "code", "LSTM")
    directory = write_corpus(tmp_path / "run")
    with module_from(tmp_path / "code", "evil", EVIL_PY) as evil:
        model.extra = evil.Payload(marker)  # pickled as os.system("touch ...")
        save_whole(model, directory / "model.pt")
    for load in (lambda: convert(directory), lambda: load_checkpoint(directory, device="cpu")):
        with pytest.raises(CheckpointError, match="needs .*os.system|needs .*posix.system"):
            load()
    assert not marker.exists()
    assert not (quill_cache / "classic").exists() or not any((quill_cache / "classic").iterdir())


def test_a_custom_module_class_is_refused_by_name(tmp_path):
    model = build_rnn_model(tmp_path / "code", "GRU")
    directory = write_corpus(tmp_path / "run")
    gate_py = "import torch\n\n\nclass Gate(torch.nn.Module):\n    pass\n"
    with module_from(tmp_path / "code", "extras", gate_py) as extras:
        model.gate = extras.Gate()
        save_whole(model, directory / "model.pt")
    with pytest.raises(CheckpointError, match="class extras.Gate"):
        convert(directory)
