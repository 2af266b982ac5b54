"""Prefix keys registered before the device is known to have written what they name, so that a failed
step can take them back.

A cache manager keys its work as soon as the host knows it: K,V blocks when a step is committed (with
overlapped scheduling, before that step's results are read), a state snapshot when its copy is queued
for the next step. Later steps may read them at once, since the device runs steps in order. But when a
step fails its writes may never have happened, and a key kept past the fault would start a later
prompt from a block or slot holding something else. So each key remembers the step that writes it:
steps are counted as their cache work is taken (`take_ops`, once per launched step) and as their
results are read (the engine's `step_finished`, in launch order); a reset drops the keys whose step
was not read, and keeps the rest cached.
"""

from __future__ import annotations

from collections import deque

from .prefix import BlockKey


class UnfinishedKeys:
    def __init__(self):
        self.num_launched = 0  # steps whose cache work was taken
        self.num_finished = 0  # of those, steps whose results were read
        self.keys: deque[tuple[int, BlockKey]] = deque()  # (the step that writes it, key), in step order

    def launched(self) -> None:
        self.num_launched += 1

    def finished(self) -> None:
        """The oldest launched step not yet finished is now: its keys are safe past a fault."""
        self.num_finished = min(self.num_finished + 1, self.num_launched)
        while self.keys and self.keys[0][0] <= self.num_finished:
            self.keys.popleft()

    def add(self, key: BlockKey, step: int) -> None:
        """`key` names what step number `step` writes (the latest launched, or the next one)."""
        if step > self.num_finished:
            self.keys.append((step, key))

    def take_back(self) -> list[BlockKey]:
        """Every key no finished step wrote (after a failed step, when counting starts over)."""
        keys = [key for _, key in self.keys]
        self.keys.clear()
        self.num_launched = self.num_finished = 0
        return keys
