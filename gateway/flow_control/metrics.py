"""Flow control in Prometheus, labelled by `backend`, `tenant` and `band`:

- `switchyard_flow_queue_depth` (gauge, read at scrape time from each queue's `depth`; with
  several workers their depths add up: mode `livesum`);
- `switchyard_flow_queue_wait_seconds` (histogram of the wait of each request that queued);
- `switchyard_flow_admissions_total{path=immediate|queued}`;
- `switchyard_flow_sheds_total{reason}` (`stats` lists the reasons).

`tenant` is the tenant only when tenants are client keys (few, named in the configuration);
with a `user`, `session` or header source it is `-`, so that clients cannot grow the series.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.observability.metrics import LATENCY_BUCKETS, observe

DEPTH = "switchyard_flow_queue_depth"
WORKER_MODES = {DEPTH: "livesum"}
UNBOUNDED_TENANT = "-"


class FlowMetrics:
    """A `FlowObserver` writing the admissions, sheds and waits of every queue."""

    def __init__(self, registry: CollectorRegistry, *, tenants_bounded: bool) -> None:
        self.tenants_bounded = tenants_bounded
        labels = ("backend", "tenant", "band")
        self.waits = Histogram("switchyard_flow_queue_wait_seconds", "Time requests waited in a backend's queue before a slot.",
                               labels, buckets=LATENCY_BUCKETS, registry=registry)
        self.admissions = Counter("switchyard_flow_admissions", "Requests given a slot: at once (immediate) or after waiting (queued).",
                                  (*labels, "path"), registry=registry)
        self.sheds = Counter("switchyard_flow_sheds", "Requests that left a backend's queue without a slot, by reason.",
                             (*labels, "reason"), registry=registry)
        self._admitted: dict[tuple[str, str, int, str], Any] = {}  # label children, resolved once

    def tenant_label(self, tenant: str) -> str:
        return tenant if self.tenants_bounded else UNBOUNDED_TENANT

    def admitted(self, backend: str, tenant: str, band: int, queued_s: float | None) -> None:
        key = (backend, self.tenant_label(tenant), band, "immediate" if queued_s is None else "queued")
        child = self._admitted.get(key)  # keyed by the labels: bounded however many tenants come
        if child is None:
            child = self._admitted[key] = self.admissions.labels(key[0], key[1], str(band), key[3])
        child.inc()
        if queued_s is not None:
            observe(self.waits.labels(backend, self.tenant_label(tenant), str(band)), queued_s)

    def shed(self, backend: str, tenant: str, band: int, reason: str) -> None:
        self.sheds.labels(backend, self.tenant_label(tenant), str(band), reason).inc()


class DepthCollector:
    """`switchyard_flow_queue_depth` from the queues' own counts, read at scrape time (register
    it with `Metrics.show_live(collector, WORKER_MODES)`)."""

    def __init__(self, queues: Mapping[str, Any], metrics: FlowMetrics) -> None:
        self.queues = queues  # backend name -> FlowQueue
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(DEPTH, "Requests waiting in a backend's queue (this worker's; workers add up).",
                                  labels=["backend", "tenant", "band"])
        for backend, queue in self.queues.items():
            summed: dict[tuple[str, str], int] = {}
            for (tenant, band), n in queue.depth.items():
                key = (self.metrics.tenant_label(tenant), str(band))
                summed[key] = summed.get(key, 0) + n
            for (tenant, band), n in summed.items():
                depth.add_metric([backend, tenant, band], n)
        yield depth
