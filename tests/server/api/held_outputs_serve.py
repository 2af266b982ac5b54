"""`quill serve` whose engines hold once they run a request, until the server gets SIGUSR1: for tests that must act
while requests are in flight, however fast the machine generates (`python -m tests.server.api.held_outputs_serve
serve ...`).

The hold is where the API side takes a step's outputs, after a report that showed a request running (so metrics
show it): on the engine's thread, or for an engine process on the thread that reads its outputs. Either way the API
side hears nothing more of the engine, and its own count of what waits stays as it was. While it holds, it prints
HELD_MESSAGE and the number of requests submitted and not finished, each time that changes. Only the server is
patched (an engine process imports this module as `__mp_main__`, where it changes nothing)."""

from __future__ import annotations

import signal
import sys
import threading

HELD_MESSAGE = "engine held: requests in flight"

if __name__ == "__main__":
    from quill.cli import main
    from quill.server.engine.process.frontend import EngineFrontend

    released = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: released.set())  # run on the main thread, never a held one
    report, deliver_all = EngineFrontend._report, EngineFrontend._deliver_all
    num_running: dict[str, int] = {}  # by engine name, at its last report

    def noted_report(self, stats) -> None:
        report(self, stats)
        num_running[self.name] = stats.num_running

    def held_delivery(self, items) -> None:
        deliver_all(self, items)
        in_flight = None
        while num_running.get(self.name) and not released.wait(0.01):  # (polls only what the event loop adds)
            if self.num_active != in_flight:
                in_flight = self.num_active
                print(f"{HELD_MESSAGE}: {in_flight}", flush=True)

    EngineFrontend._report, EngineFrontend._deliver_all = noted_report, held_delivery
    sys.exit(main())
