"""quill_cache_config_info in process: each model's labels match its engine's real cache (K,V blocks for the
Transformer, none for the LSTM and the gated CNN)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from quill.server.api.cache_config_info import cache_config_labels
from quill.server.engine import CacheConfig


def _engine(num_kv_blocks: int | None, block_size: int = 16, enable_prefix_caching: bool = True):
    config = SimpleNamespace(cache=CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching))
    return SimpleNamespace(config=config, num_kv_blocks=num_kv_blocks)


def test_kv_blocks_are_the_engines_count():
    assert cache_config_labels(_engine(128)) == {"block_size": "16", "num_gpu_blocks": "128",
                                                 "enable_prefix_caching": "True"}


def test_a_state_model_reports_no_blocks():
    engine = _engine(None, enable_prefix_caching=False)
    assert cache_config_labels(engine) == {"block_size": "16", "enable_prefix_caching": "False"}


def _kv_blocks(engine) -> int | None:
    kinds = [k for k in engine.core.layout.kinds if k.part == "kv"]
    return kinds[0].num_blocks if kinds else None


async def test_the_scrape_carries_each_models_real_cache(client, app):
    text = (await client.get("/metrics")).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "quill_cache_config_info"]
    assert family.type == "gauge" and all(s.value == 1 for s in family.samples)
    labels = {s.labels["model"]: s.labels for s in family.samples}
    assert set(labels) == set(app.state.host.models)
    for name, hosted in app.state.host.models.items():
        blocks = _kv_blocks(hosted.engine)
        expected = {"model": name, "block_size": "4", "enable_prefix_caching": "True"}
        if blocks is not None:
            expected["num_gpu_blocks"] = str(blocks)
        assert labels[name] == expected
    assert "num_gpu_blocks" in labels["tiny-transformer"] and "num_gpu_blocks" not in labels["tiny-lstm"]
