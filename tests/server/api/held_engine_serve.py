"""`quill serve` whose engine processes never finish loading their weights, for tests that stop a server
while its engine processes load: `python -m tests.server.api.held_engine_serve serve ...`.

An engine process is spawned: it runs this module again, as `__mp_main__`, before its main function, so
the hold is put in place there too (and only there and in the server: importing this module changes
nothing). Each engine process prints HELD_MESSAGE once it holds, past the point where it ignores SIGTERM
(only the server may stop it)."""

from __future__ import annotations

import sys
import threading

HELD_MESSAGE = "engine process: load held"


def _never_loads(*args, **kwargs):
    print(HELD_MESSAGE, flush=True)
    threading.Event().wait()


if __name__ in ("__main__", "__mp_main__"):
    from quill.server.engine.process import core_process

    core_process.load_engine_model = _never_loads  # what an engine process loads its model with

if __name__ == "__main__":
    from quill.cli import main

    sys.exit(main())
