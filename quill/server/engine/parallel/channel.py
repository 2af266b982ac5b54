"""Rank 0's messages to the other ranks: numbered JSON headers in the group's store, each step's payload broadcast
over the group.

The header goes through the store, not a collective: a rank waiting for the next step waits in the store's `get`,
which can wait for days and fails at once if rank 0's process (the store's server) is gone, whereas a collective
would time out while the server sits idle. JSON, not pickle: the store listens on the network when ranks run on
several machines. Rank 0 deletes a header once every rank must have read it: a rank reads header n before it joins
step n's collectives, and rank 0 waits for step n's logits (gathered from every rank) before it sends a step far past n.
"""

from __future__ import annotations

import json

import torch

from quill.models.parallel.collectives import Collectives

KEY = "quill/message/{}"
KEEP = 8  # headers kept past the newest: rank 0 never runs more than a step or two ahead of the last logits it read


class StepChannel:
    def __init__(self, store, group: Collectives, device: torch.device):
        self.store = store
        self.group = group
        self.device = device
        self.count = 0  # messages sent (rank 0) or received (the others)

    def send(self, header: dict, payload: torch.Tensor | None = None) -> None:
        """Rank 0: the next message; its payload (int64) is broadcast at once, so the others must be reading."""
        header = {**header, "payload": 0 if payload is None else int(payload.numel())}
        self.store.set(KEY.format(self.count), json.dumps(header))
        if payload is not None:
            self.group.broadcast(payload)
        if self.count >= KEEP:
            self.store.delete_key(KEY.format(self.count - KEEP))
        self.count += 1

    def receive(self) -> tuple[dict, torch.Tensor | None]:
        """The other ranks: the next message, waiting for it as long as it takes; its payload on `device`."""
        header = json.loads(self.store.get(KEY.format(self.count)))
        self.count += 1
        if not header["payload"]:
            return header, None
        return header, self.group.broadcast(torch.empty(header["payload"], dtype=torch.long, device=self.device))
