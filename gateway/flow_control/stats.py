"""What a queue tells about itself. The queue keeps its depth (this worker's waiting requests,
by tenant and band: several workers' depths add up) and reports each admission and shed to a
`FlowObserver`: `FlowCounters` counts them in plain dictionaries (tests, `switchyard` tools),
`gateway.flow_control.metrics.FlowMetrics` in Prometheus families.

Shed reasons: `queue_full`, `slo`, `timeout` (each a 429), `deadline` (the request's own
`request_timeout_s` came first: 504), `cancelled` (the client went away while waiting),
`shutdown` (the server drained), `state_error` (the shared ledger failed and
`on_state_error = "deny"`).
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class FlowObserver(Protocol):
    def admitted(self, backend: str, tenant: str, band: int, queued_s: float | None) -> None:
        """A request got its slot: at once (`queued_s` None) or after waiting."""

    def shed(self, backend: str, tenant: str, band: int, reason: str) -> None: ...


class FlowCounters:
    def __init__(self) -> None:
        self.admissions: Counter[tuple[str, str]] = Counter()  # (tenant, "immediate" | "queued")
        self.sheds: Counter[tuple[str, str]] = Counter()  # (tenant, reason)
        self.waited_s: Counter[tuple[str, int]] = Counter()  # (tenant, band): seconds waited by queued admissions

    def admitted(self, backend: str, tenant: str, band: int, queued_s: float | None) -> None:
        self.admissions[tenant, "immediate" if queued_s is None else "queued"] += 1
        if queued_s is not None:
            self.waited_s[tenant, band] += queued_s

    def shed(self, backend: str, tenant: str, band: int, reason: str) -> None:
        self.sheds[tenant, reason] += 1
