"""Where a model's KV-cache events go, as vLLM's KVEventsConfig names it (`--kv-events-*` flags)."""

from __future__ import annotations

from dataclasses import dataclass, replace

MODEL_PLACEHOLDER = "{model}"  # in the topic: the hosted model's name (llm-d reads "kv@<pod>@<model>")


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str  # PUB socket: bound where it holds "*", "::", or is ipc:// or inproc://, else connected (as vLLM)
    replay_endpoint: str | None = None  # ROUTER socket, always bound: replays buffered batches on request
    topic: str = ""  # the first frame of every message; vLLM's default is empty too
    buffer_steps: int = 10_000  # batches kept for replay (one per engine step that changed the cache)
    hwm: int = 100_000  # messages the PUB socket queues per subscriber before it drops (vLLM's default)

    def __post_init__(self):
        if not self.endpoint:
            raise ValueError("a KV-events endpoint is needed (e.g. tcp://*:5557)")
        if self.buffer_steps < 1 or self.hwm < 0:
            raise ValueError("kv_events buffer_steps must be positive and hwm not negative")

    def for_model(self, index: int, name: str) -> "KVEventsConfig":
        """The settings of the hosted model number `index` (from 0): its TCP ports offset by `index` (as vLLM
        offsets them per data-parallel rank), other endpoints suffixed, `{model}` in the topic replaced by `name`."""
        return replace(self, endpoint=_offset(self.endpoint, index),
                       replay_endpoint=None if self.replay_endpoint is None else _offset(self.replay_endpoint, index),
                       topic=self.topic.replace(MODEL_PLACEHOLDER, name))


def _offset(endpoint: str, index: int) -> str:
    if index == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        address, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"a TCP endpoint for KV events needs a port: {endpoint!r}")
        return f"{address}:{int(port) + index}"
    return f"{endpoint}-{index}"


def binds(endpoint: str) -> bool:
    """Whether a PUB endpoint is bound (a wildcard address or a local transport) rather than connected to a
    subscriber that binds (llm-d's central indexer listens, and model servers connect to it)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
