"""`observe_all` (a request's inter-token gaps in one go) and `gateway.observability.metrics.observe` (one
value) leave a histogram exactly as prometheus_client's `observe` per value does, bucket edges
and values past the last bound included."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from gateway.observability.metrics import LATENCY_BUCKETS, observe, observe_all


def samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}


def _values() -> list[float]:
    rng = random.Random(0)
    return [rng.choice([*LATENCY_BUCKETS, 0.0, 500.0]) if rng.random() < 0.3 else rng.random() * 3 for _ in range(2000)]


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("h", "h", ["arm"], registry=registry, buckets=LATENCY_BUCKETS).labels("a")


def test_observe_all_equals_one_observe_per_value() -> None:
    values = _values()
    (one, h_one), (batched, h_batched) = _histogram(), _histogram()
    for value in values:
        h_one.observe(value)
    for start in range(0, len(values), 16):  # per request
        observe_all(h_batched, values[start:start + 16])
    observe_all(h_batched, [])
    got, want = samples(batched), samples(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_observe_equals_prometheus_observe() -> None:
    (one, h_one), (ours, h_ours) = _histogram(), _histogram()
    for value in _values():
        h_one.observe(value)
        observe(h_ours, value)
    assert samples(ours) == samples(one)
