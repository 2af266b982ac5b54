"""`quill serve` whose engines lose their device at their first step, for tests of what the server does then:
`python -m tests.server.api.lost_device_serve serve ...`.

Every engine step raises a sticky CUDA error and the device probe says the device is gone, as after an illegal
memory access. An engine process runs this module again as `__mp_main__`, so the fault is put in place there too
(and only there and in the server: importing this module changes nothing)."""

from __future__ import annotations

import sys

STICKY = "CUDA error: an illegal memory access was encountered"


def _illegal_access(self):
    raise RuntimeError(STICKY)


if __name__ in ("__main__", "__mp_main__"):
    from quill.server.engine.process import core_loop
    from quill.server.engine.core import EngineCore

    EngineCore.step = _illegal_access
    core_loop.device_lost = lambda device: True

if __name__ == "__main__":
    from quill.cli import main

    sys.exit(main())
