"""What the gateway shows of each backend's replicas: Prometheus families read at scrape time
from the backends' own counts (`replica_stats()`, a list of `plugins.fleet.replica.ReplicaStats`),
so the request path does no metric work for them; and the per-backend load the routing hook
reads (`load()`, else the gateway's own in-flight count).

Families, labelled by `backend` and `replica` (the replica's base URL: bounded by the fleet):
`switchyard_replica_attempts_total{outcome}`, `switchyard_replica_routed_total{reason}`,
`switchyard_replica_requests_in_flight`, `switchyard_replica_draining`,
`switchyard_replica_circuit_state`, `switchyard_replica_healthy`, `switchyard_replica_load`
(what routing believes), `switchyard_replica_load_stale`, `switchyard_replica_load_age_seconds`,
`switchyard_replica_engine_requests{state=running|waiting}`,
`switchyard_replica_engine_kv_cache_usage`,
`switchyard_replica_engine_prefix_cache_tokens_total{kind=queried|hit}` and
`switchyard_replica_prefix_index_blocks`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LABELS = ["backend", "replica"]
_P = "switchyard_replica_"
# With several workers (`gateway.observability.live_collectors`): the gateway's own counts add up over the workers;
# what the engines report is the same from every worker (the latest is shown); the worst circuit
# and health any worker sees
WORKER_MODES = {
    f"{_P}attempts": "sum", f"{_P}routed": "sum", f"{_P}requests_in_flight": "livesum",
    f"{_P}draining": "livemax", f"{_P}circuit_state": "livemax", f"{_P}healthy": "livemin",
    f"{_P}load": "livemax", f"{_P}load_stale": "livemax", f"{_P}load_age_seconds": "livemin",
    f"{_P}engine_requests": "livemostrecent", f"{_P}engine_kv_cache_usage": "livemostrecent",
    f"{_P}engine_prefix_cache_tokens": "livemostrecent", f"{_P}prefix_index_blocks": "livemax",
}


class ReplicaCollector:
    def __init__(self, backends: Mapping[str, Any]) -> None:
        self.backends = backends

    def describe(self) -> list[Metric]:
        return []  # families are made at collect time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"switchyard_replica_{name}", doc, labels=LABELS + (extra or []))

        def counter(name: str, doc: str, extra: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(f"switchyard_replica_{name}", doc, labels=LABELS + extra)

        attempts = counter("attempts", "Attempts sent to each replica, by outcome (ok, cancelled, or the error kind).", ["outcome"])
        routed = counter("routed", "Placement decisions per replica, by the policy's reason.", ["reason"])
        in_flight = gauge("requests_in_flight", "The gateway's requests in flight on each replica.")
        draining = gauge("draining", "1 while a replica that left discovery finishes its requests.")
        circuit = gauge("circuit_state", "Circuit breaker per replica: 0 closed, 1 half-open, 2 open.")
        healthy = gauge("healthy", "The last health probe of each replica: 1 passed, 0 failed.")
        load = gauge("load", "The load routing believes: engine running + waiting (corrected), or in-flight when stale.")
        stale = gauge("load_stale", "1 when the engine's load signal is older than 3 scrape intervals (or missing).")
        age = gauge("load_age_seconds", "Seconds since the engine's load signal was last scraped.")
        engine = gauge("engine_requests", "Requests the engine reports, by state.", ["state"])
        kv = gauge("engine_kv_cache_usage", "KV cache usage the engine reports (0..1).")
        prefix = counter("engine_prefix_cache_tokens", "Prompt tokens the engine looked up in its prefix cache, and found.", ["kind"])
        blocks = gauge("prefix_index_blocks", "Prompt blocks the prefix index believes each replica holds.")
        for backend in self.backends.values():
            stats = getattr(backend, "replica_stats", None)
            for s in stats() if stats is not None else ():
                key = [s.backend, s.replica]
                for outcome, n in s.attempts.items():
                    attempts.add_metric([*key, outcome], n)
                for reason, n in s.routed.items():
                    routed.add_metric([*key, reason], n)
                samples = (
                    (in_flight, key, s.in_flight), (draining, key, int(s.draining)), (circuit, key, s.circuit),
                    (healthy, key, None if s.healthy is None else int(s.healthy)), (load, key, s.load),
                    (stale, key, int(s.stale)), (age, key, s.signal_age_s),
                    (engine, [*key, "running"], s.running), (engine, [*key, "waiting"], s.waiting),
                    (kv, key, s.kv_cache_usage), (prefix, [*key, "queried"], s.prefix_queried_tokens),
                    (prefix, [*key, "hit"], s.prefix_hit_tokens), (blocks, key, s.cached_blocks),
                )
                for family, labels, value in samples:  # a value the replica does not report is left out
                    if value is not None:
                        family.add_metric(labels, value)
        yield from (attempts, routed, in_flight, draining, circuit, healthy, load, stale, age, engine, kv, prefix, blocks)


class BackendLoads(Mapping[str, float]):
    """Backend name -> the load the routing hook compares (`least_load`, `prefix_cache` across
    a route's targets): the backend's `load()` (requests per replica its engines report), else
    the gateway's own requests in flight there. Read on demand, never copied."""

    def __init__(self, backends: Mapping[str, Any], in_flight: Mapping[str, int]) -> None:
        self.backends = backends
        self.in_flight = in_flight

    def __getitem__(self, name: str) -> float:
        backend = self.backends[name]
        load = getattr(backend, "load", None)
        return float(load()) if load is not None else float(self.in_flight.get(name, 0))

    def __iter__(self) -> Iterator[str]:
        return iter(self.backends)

    def __len__(self) -> int:
        return len(self.backends)
