"""Collectors read at scrape time (this process's live values, such as `gateway.observability.replica_load`)
under several worker processes.

With workers, `/metrics` shows the multiprocess files every worker writes (`gateway.observability.metrics`),
not the collectors of the one process that answers, so each worker copies its collectors' samples
into multiprocess metrics: every second, and before it answers a scrape. A family's mode says how
the workers' values combine: `sum` (a counter of this worker's own events: added up over the
workers, dead ones too) or a prometheus_client gauge mode (`livesum`, `livemax`, `livemin`,
`livemostrecent`, over the live workers). A label set a collector stops reporting keeps the last
value it had.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

REFRESH_S = 1.0
log = logging.getLogger("switchyard.metrics")


class MultiprocessMirror:
    def __init__(self, collector: Any, registry: CollectorRegistry, modes: Mapping[str, str]) -> None:
        """`modes` maps each family name the collector yields to its mode (see the module)."""
        self.collector = collector
        self.registry = registry
        self.modes = modes
        self._metrics: dict[str, Counter | Gauge] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}  # a sum family's last value per label set
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Refresh every REFRESH_S seconds on the running loop until `stop()`."""
        try:
            self.refresh()
        except Exception:  # a collector's error must not end the mirroring
            log.exception("copying live metrics for the other workers failed")
        self._timer = asyncio.get_running_loop().call_later(REFRESH_S, self.start)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def refresh(self) -> None:
        for family in self.collector.collect():
            mode = self.modes[family.name]
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = tuple(sample.labels.values())
                metric = self._metric(family, sample.name, tuple(sample.labels), mode)
                child = metric.labels(*labels) if labels else metric
                if mode != "sum":
                    child.set(sample.value)
                    continue
                key = (sample.name, labels)
                added = sample.value - self._counted.get(key, 0.0)
                if added > 0:
                    child.inc(added)
                    self._counted[key] = sample.value

    def _metric(self, family: Any, name: str, labelnames: tuple[str, ...], mode: str) -> Counter | Gauge:
        metric = self._metrics.get(name)
        if metric is None:
            if mode == "sum":
                metric = Counter(name.removesuffix("_total"), family.documentation, labelnames, registry=self.registry)
            else:
                metric = Gauge(name, family.documentation, labelnames, registry=self.registry, multiprocess_mode=mode)
            self._metrics[name] = metric
        return metric
