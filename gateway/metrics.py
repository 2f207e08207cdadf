"""Prometheus metrics, one registry per app (so several apps in one process do not clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("route", "backend")
        self.requests = Counter(
            "switchyard_requests", "Requests finished, by outcome.", (*labels, "outcome"), registry=self.registry
        )
        self.in_flight = Gauge("switchyard_requests_in_flight", "Requests in flight.", labels, registry=self.registry)
        self.ttft = Histogram(
            "switchyard_time_to_first_token_seconds", "Time to first token.", labels, buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.itl = Histogram(
            "switchyard_inter_token_latency_seconds", "Time between token events.", labels, buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.e2e = Histogram(
            "switchyard_request_duration_seconds", "End-to-end request time.", labels, buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.tokens = Counter(
            "switchyard_tokens", "Tokens processed, by kind (prompt, completion, cached).", (*labels, "kind"), registry=self.registry
        )
        self.errors = Counter("switchyard_errors", "Errors answered, by type.", ("type",), registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
