"""Run a module as `python -m MODULE ARGS` would, with SIGTERM (and SIGINT) raising KeyboardInterrupt.

    python -m benchmarks.interruptible pytest -q tests/models
    python -m benchmarks.interruptible benchmarks.gpu_bench --device cuda --shapes gpt2

A time limit (`timeout`) then stops the module the way Ctrl-C does: pytest still writes its report,
and the benchmark stops its server and deletes its checkpoints. SIGINT is set too because a
background job starts with it ignored, and Python keeps an ignored SIGINT ignored.
"""

from __future__ import annotations

import runpy
import signal
import sys


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m benchmarks.interruptible MODULE [ARGS...]")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.default_int_handler)
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
