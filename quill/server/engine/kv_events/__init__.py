"""KV-cache events for prefix-aware routers (llm-d's precise prefix-cache scorer, and others that read vLLM's
format): which K,V blocks a model's prefix cache holds, published over ZMQ as vLLM publishes them.

The block manager reports every change to its prefix cache to a collector (collector.py), which batches them per
engine step as vLLM's records (events.py); a publisher thread sends each batch with a sequence number and keeps the
last ones for replay (publisher.py). Configured per model (config.py); docs/serving.md says what goes on the wire.
"""

from .collector import KVEventCollector, open_kv_events
from .config import KVEventsConfig

__all__ = ["KVEventCollector", "KVEventsConfig", "open_kv_events"]
