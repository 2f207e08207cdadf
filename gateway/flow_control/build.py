"""Building a backend's queue at start-up: its ledger (in this process, or in Redis when
`[server] state` is set: one RESP client shared by every backend's ledger) and its limits
(`[backends.flow_control]` over `[server.flow_control]`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from gateway.flow_control.bands import Bands
from gateway.flow_control.config import BackendFlowConfig, FlowControlConfig
from gateway.flow_control.ledger import Ledger
from gateway.flow_control.memory_ledger import MemoryLedger
from gateway.flow_control.queue import FlowQueue, QueueLimits
from gateway.flow_control.redis_ledger import RedisLedger
from gateway.flow_control.service_rate import ServiceRate
from gateway.flow_control.stats import FlowObserver
from gateway.keys.resp import RespClient

NO_BACKEND_TABLE = BackendFlowConfig()


def queue_limits(config: FlowControlConfig, backend: BackendFlowConfig | None) -> QueueLimits:
    backend = backend or NO_BACKEND_TABLE
    return QueueLimits(
        max_queue=config.max_queue if backend.max_queue is None else backend.max_queue,
        queue_timeout_s=config.queue_timeout_s if backend.queue_timeout_s is None else backend.queue_timeout_s,
        poll_interval_s=config.poll_interval_s,
    )


def build_ledger(backend: str, config: FlowControlConfig, limits: QueueLimits, *, client: RespClient | None, owner: str,
                 lease_s: float) -> Ledger:
    """`client`: the shared RESP client when `[server] state` is set, else None (in process);
    `lease_s`: the longest a request may run (`gateway.keys.longest_deadline` plus its margin)."""
    num_bands = Bands(config.band_edges).num_bands
    if client is None:
        return MemoryLedger(num_bands, config.aging_s, owner=owner)
    return RedisLedger(client, backend, num_bands=num_bands, aging_s=config.aging_s, owner=owner, lease_s=lease_s,
                       expiry_s=limits.queue_timeout_s)


def build_queue(backend: str, config: FlowControlConfig, backend_table: BackendFlowConfig | None, *,
                capacity: Callable[[], int], has_room: Callable[[], bool] | None, client: RespClient | None, owner: str,
                lease_s: float, observer: FlowObserver, on_state_error: Literal["allow", "deny"]) -> FlowQueue:
    limits = queue_limits(config, backend_table)
    ledger = build_ledger(backend, config, limits, client=client, owner=owner, lease_s=lease_s)
    return FlowQueue(backend, ledger, capacity, has_room=has_room, limits=limits, rate=ServiceRate(config.rate_smoothing),
                     observer=observer, on_state_error=on_state_error)
