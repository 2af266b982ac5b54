"""Reading pickled checkpoints without running their code.

`torch.load(weights_only=True)` only rebuilds tensors and plain containers; every other class a file
names must be on an allow-list. The toolkits' files name their own classes (`model.RNNModel`,
`argparse.Namespace`, torch.nn modules): each allowed name is rebuilt as a `PickledObject`, an inert
record of the name and the attributes the file stored, so the user's code (and ours) is never imported
or called. A file naming anything else is refused with that name.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

import torch

from quill.models.loading.errors import CheckpointError

_REFUSED = re.compile(r"GLOBAL ([\w.]+)")  # how torch's weights-only unpickler names a class it refused
_UNPICKLER_SAYS = re.compile(r"WeightsUnpickler error: \s*(.+)")  # its reason, after its advice
# What the weights-only unpickler says of the legacy format's ("module", class, file, source) records.
_LEGACY_MODULE = "Only persistent_load of storage is allowed"


class PickledObject:
    """An instance of an allowed class, as stored: its attributes, never its behaviour."""

    qualified_name = "?"

    def __setstate__(self, state) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"{self.qualified_name}: stored state is not a dict of attributes")
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"<pickled {self.qualified_name}>"


def _stand_in(qualified_name: str) -> tuple[type, str]:
    name = qualified_name.rsplit(".", 1)[-1]
    return type(name, (PickledObject,), {"qualified_name": qualified_name}), qualified_name


def _reason(message: str) -> str:
    said = _UNPICKLER_SAYS.search(message)
    return said.group(1).strip() if said else message.splitlines()[0]


def load_restricted(path: str | Path, allowed: Iterable[str] = ()) -> object:
    """The object pickled in `path` (a torch.save file), each class in `allowed` ("module.Name") rebuilt as
    a `PickledObject`; a file naming another class is refused with a CheckpointError naming it."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals([_stand_in(name) for name in allowed]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if _LEGACY_MODULE in str(e):
            raise CheckpointError(path, "a whole module saved in PyTorch's format before 1.6, which stores its "
                                        "classes' source code for the loader to run: Quill does not read it; where "
                                        "you trust the file, load it and save its state_dict() instead") from None
        wanted = _REFUSED.search(str(e))
        what = f"class {wanted.group(1)}" if wanted else _reason(str(e))
        raise CheckpointError(path, f"the file needs {what}, which Quill does not unpickle "
                                    f"(allowed: {', '.join(allowed) or 'tensors and plain containers'})") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(path, f"not a readable PyTorch file ({str(e).splitlines()[0]})") from None


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def load_plain(path: str | Path) -> object:
    """A plain pickle (pickle.dump, not torch.save) of strings, numbers and containers only: a file that
    names any class or function is refused with its name. For the toolkits' vocabularies (fastai's itos)."""
    path = Path(path)
    if zipfile.is_zipfile(path):  # torch.save'd after all
        return load_restricted(path)
    try:
        with open(path, "rb") as f:
            return _NoClasses(f).load()
    except pickle.UnpicklingError as e:
        wanted = _REFUSED.search(str(e))
        what = f"class {wanted.group(1)}" if wanted else str(e)
        raise CheckpointError(path, f"the file needs {what}, which Quill does not unpickle (a vocabulary is a "
                                    "list of strings)") from None
    except (EOFError, OSError, ValueError) as e:
        raise CheckpointError(path, f"not a readable pickle ({e})") from None


def peek_pickle(path: str | Path, limit: int = 1 << 20) -> bytes:
    """The pickle bytes of a torch.save file (its data.pkl, or the start of a legacy file), unread: for
    recognising a format by the class and key names it spells, without unpickling anything."""
    try:
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as f:
                return f.read(limit)
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            return archive.read(name)[:limit] if name else b""
    except (OSError, zipfile.BadZipFile):
        return b""


def attributes(obj: object) -> dict:
    """The stored attributes of a `PickledObject` (or a plain dict / argparse-like record)."""
    return obj if isinstance(obj, dict) else vars(obj)
