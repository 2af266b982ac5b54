"""A registry of interchangeable implementations, one chosen per device when a model is loaded.

Attention backends (quill/models/attention) and layer ops (quill/models/kernels) both work this way: a name
per implementation, a reference that runs anywhere, a default per device type where a faster one
exists, and a clear error when the implementation asked for cannot run on the device.
"""

from __future__ import annotations

import logging
from typing import Generic, TypeVar

import torch

log = logging.getLogger("quill.models")

T = TypeVar("T")  # a class with `unavailable_reason(device) -> str | None`


class DeviceRegistry(Generic[T]):
    def __init__(self, what: str, entries: dict[str, T], reference: str, defaults: dict[str, str]):
        """`what` names the choice in messages; `reference` runs on any device; `defaults`: device type -> name."""
        self.what, self.entries, self.reference, self.defaults = what, entries, reference, defaults

    def default(self, device: torch.device | str) -> str:
        """The choice for `device`: its default where that can run there, else the reference."""
        device = torch.device(device)
        name = self.defaults.get(device.type, self.reference)
        reason = self.entries[name].unavailable_reason(device)
        if reason is not None:
            log.warning("%s %r %s; using %r", self.what, name, reason, self.reference)
            return self.reference
        return name

    def select(self, name: str, device: torch.device | str) -> T:
        """The entry for `name` ("auto": the device's default); ValueError if it cannot run on `device`."""
        device = torch.device(device)
        if name == "auto":
            name = self.default(device)
        if name not in self.entries:
            raise ValueError(f"{self.what} must be auto or one of {', '.join(self.entries)}, not {name!r}")
        reason = self.entries[name].unavailable_reason(device)
        if reason is not None:
            raise ValueError(f"{self.what} {name!r} {reason}")
        return self.entries[name]
