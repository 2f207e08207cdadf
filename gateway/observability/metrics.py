"""Prometheus metrics, one registry per app (so several apps in one process do not clash).

With several worker processes (`gateway.worker_pool` sets `PROMETHEUS_MULTIPROC_DIR`) every process
writes its samples into files there and `render()` reads them all: counters and histograms add
up, also those of workers that died; in-flight gauges add up over the live workers, and a
backend's circuit state is the worst (its health the worst) any live worker sees.

Per-arm series are labelled by `route` and `backend`. Shadow copies of requests (a route's
`shadow` table) are counted in their own `switchyard_shadow_*` families, so mirrored traffic
never mixes into the arms' numbers. `Metrics.arm(route, backend)` resolves an arm's label
children once and caches them: the request path does no label lookups of its own.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.observability.live_collectors import MultiprocessMirror

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
LABELS = ("route", "backend")


def observe(histogram: Histogram, value: float) -> None:
    """`histogram.observe(value)` (a label child without exemplars): the bucket found by
    bisection, as in `observe_all`, instead of a walk over the bounds and two checks."""
    bounds = getattr(histogram, "_upper_bounds", None)
    if bounds is None:  # another prometheus_client layout
        histogram.observe(value)
        return
    histogram._sum.inc(value)  # type: ignore[attr-defined]
    histogram._buckets[bisect_left(bounds, value)].inc(1)  # type: ignore[attr-defined]


def observe_all(histogram: Histogram, values: list[float]) -> None:
    """`histogram.observe(v)` for each of `values` (a label child without exemplars), adding each
    bucket's count and the sum once: a request's inter-token gaps cost a few increments instead
    of two per token (each a locked write of an mmap'ed value under several workers)."""
    if not values:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    if bounds is None:  # another prometheus_client layout: one by one
        for value in values:
            histogram.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        i = bisect_left(bounds, value)  # the first bucket whose bound holds it, as observe() picks
        counts[i] = counts.get(i, 0) + 1
    buckets = histogram._buckets  # type: ignore[attr-defined]
    for i, n in counts.items():
        buckets[i].inc(n)
    histogram._sum.inc(sum(values))  # type: ignore[attr-defined]


class ArmFamilies:
    """The metric families of one kind of traffic (the arms', or the shadows')."""

    def __init__(self, registry: CollectorRegistry, prefix: str, what: str) -> None:
        def hist(name: str, doc: str) -> Histogram:
            return Histogram(f"{prefix}_{name}", f"{doc} ({what})", LABELS, buckets=LATENCY_BUCKETS, registry=registry)

        self.requests = Counter(f"{prefix}_requests", f"Requests finished, by outcome ({what}).", (*LABELS, "outcome"), registry=registry)
        self.request_errors = Counter(
            f"{prefix}_request_errors",
            f"Failed requests by error (upstream kinds such as timeout, bad_gateway; or the error class) ({what}).",
            (*LABELS, "error"),
            registry=registry,
        )
        self.ttft = hist("time_to_first_token_seconds", "Time to first token")
        self.itl = hist("inter_token_latency_seconds", "Time between token events")
        self.e2e = hist("request_duration_seconds", "End-to-end request time")
        self.tokens = Counter(
            f"{prefix}_tokens", f"Tokens processed, by kind (prompt, completion, cached) ({what}).", (*LABELS, "kind"), registry=registry
        )


class ArmMetrics:
    """The label children of one (route, backend) pair, resolved once."""

    __slots__ = ("families", "labels", "in_flight", "attempts_ok", "ttft", "itl", "e2e", "prompt", "completion", "cached",
                 "_outcomes", "_errors")

    def __init__(self, families: ArmFamilies, route: str, backend: str, in_flight: Gauge | None,
                 attempts: Counter | None = None) -> None:
        self.families = families
        self.labels = (route, backend)
        self.in_flight = None if in_flight is None else in_flight.labels(route, backend)
        self.attempts_ok = None if attempts is None else attempts.labels(route, backend, "ok")
        self.ttft = families.ttft.labels(route, backend)
        self.itl = families.itl.labels(route, backend)
        self.e2e = families.e2e.labels(route, backend)
        self.prompt = families.tokens.labels(route, backend, "prompt")
        self.completion = families.tokens.labels(route, backend, "completion")
        self.cached = families.tokens.labels(route, backend, "cached")
        self._outcomes: dict[str, Counter] = {}
        self._errors: dict[str, Counter] = {}

    def finished(self, outcome: str) -> None:
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = self.families.requests.labels(*self.labels, outcome)
        child.inc()

    def failed(self, error: str) -> None:
        child = self._errors.get(error)
        if child is None:
            child = self._errors[error] = self.families.request_errors.labels(*self.labels, error)
        child.inc()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.primary = ArmFamilies(r, "switchyard", "client traffic")
        self.shadow = ArmFamilies(r, "switchyard_shadow", "shadow copies")
        # the primary families under their historical names
        self.requests = self.primary.requests
        self.ttft = self.primary.ttft
        self.itl = self.primary.itl
        self.e2e = self.primary.e2e
        self.tokens = self.primary.tokens
        self.in_flight = Gauge("switchyard_requests_in_flight", "Requests in flight.", LABELS, registry=r, multiprocess_mode="livesum")
        self.errors = Counter("switchyard_errors", "Errors answered, by type.", ("type",), registry=r)
        self.ignored_fields = Counter(
            "switchyard_ignored_fields",
            "Request fields accepted and ignored, by wire API and field (README: what each API ignores).",
            ("api", "field"),
            registry=r,
        )
        self.dropped_tools = Counter(
            "switchyard_dropped_tools",
            "Hosted tools (web_search, file_search...) left out of requests under `hosted_tools = \"drop\"`, by wire API "
            "and tool type.",
            ("api", "tool"),
            registry=r,
        )
        self.attempts = Counter(
            "switchyard_route_attempts",
            "Attempts to serve a request on a route's target, by outcome: ok (served), an upstream error kind "
            "(failed before the first token), unsupported (the backend cannot do the request), or max_tokens_fitted "
            "(the output limit did not fit the context left: started again with one that does).",
            (*LABELS, "outcome"),
            registry=r,
        )
        self.shadow_skipped = Counter(
            "switchyard_shadow_skipped",
            "Shadow copies not sent, by reason (max_concurrent, circuit_open, at_capacity, unsupported, queue).",
            ("route", "backend", "reason"),
            registry=r,
        )
        self.circuit_state = Gauge(
            "switchyard_backend_circuit_state", "Circuit breaker per backend: 0 closed, 1 half-open, 2 open.", ("backend",), registry=r,
            multiprocess_mode="livemax",
        )
        self.backend_healthy = Gauge(
            "switchyard_backend_healthy", "The last health probe of each backend: 1 passed, 0 failed.", ("backend",), registry=r,
            multiprocess_mode="livemin",
        )
        self.request_log_dropped = Counter(
            "switchyard_request_log_dropped", "Request log lines dropped because the writer fell behind.", registry=r
        )
        self._arms: dict[tuple[str, str, bool], ArmMetrics] = {}
        self._shown = r  # what /metrics renders: this registry, or every process's files
        self._mirrors: list[MultiprocessMirror] = []
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory:
            self._shown = CollectorRegistry()
            MultiProcessCollector(self._shown, path=directory)

    def show_live(self, collector: object, modes: Mapping[str, str]) -> None:
        """Show a collector read at scrape time: registered here with one process; with several,
        copied into every worker's files (`gateway.observability.live_collectors`; `modes` says how the workers'
        values of each family combine). Call with the event loop running."""
        if self._shown is self.registry:
            self.registry.register(collector)  # type: ignore[arg-type]
            return
        mirror = MultiprocessMirror(collector, self.registry, modes)
        mirror.start()
        self._mirrors.append(mirror)

    def close(self) -> None:
        for mirror in self._mirrors:
            mirror.stop()

    def arm(self, route: str, backend: str, *, shadow: bool = False) -> ArmMetrics:
        key = (route, backend, shadow)
        arm = self._arms.get(key)
        if arm is None:
            if shadow:
                arm = ArmMetrics(self.shadow, route, backend, None)
            else:
                arm = ArmMetrics(self.primary, route, backend, self.in_flight, self.attempts)
            self._arms[key] = arm
        return arm

    def render(self) -> bytes:
        for mirror in self._mirrors:
            mirror.refresh()
        return generate_latest(self._shown)
