"""The metrics helpers: repeated observations land exactly where as many `observe` calls would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from quill.server.api.metrics import TOKEN_LATENCY_BUCKETS, observe_repeated


def _samples(registry: CollectorRegistry) -> dict:
    """Every sample but the series' creation time."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in registry.collect() for s in metric.samples if not s.name.endswith("_created")}


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("gap", "test", ["model"], buckets=TOKEN_LATENCY_BUCKETS, registry=registry)


@pytest.mark.parametrize("value", [0.0, 0.0004, 0.001, 0.0011, 0.04, 2.5, 7.0])  # below, on and between bounds, +Inf
@pytest.mark.parametrize("count", [1, 3])
def test_observe_repeated_matches_observe(value, count):
    expected_registry, expected = _histogram()
    for _ in range(count):
        expected.labels(model="m").observe(value)
    registry, histogram = _histogram()
    observe_repeated(histogram.labels(model="m"), value, count)
    assert _samples(registry) == _samples(expected_registry)
    assert _samples(registry)[("gap_count", (("model", "m"),))] == count
