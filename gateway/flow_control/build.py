"""Flow control of one gateway process, built at start-up (`build_flow_control`): the policy,
one queue per backend — its ledger in this process, or in Redis when `[server] state` is set
(one RESP client shared by every backend's ledger) — its readings of the backend
(`capacity.backend_readings`, and `capacity.backend_headroom` with `priority_headroom`), and
the metrics. None when `[server.flow_control]` is off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config import BackendFlowConfig, Config, FlowControlConfig
from gateway.flow_control.bands import Bands
from gateway.flow_control.capacity import backend_headroom, backend_readings
from gateway.flow_control.ledger import Ledger, MemoryLedger
from gateway.flow_control.metrics import WORKER_MODES, DepthCollector, FlowMetrics
from gateway.flow_control.policy import FlowPolicy
from gateway.flow_control.queue import FlowQueue, QueueLimits, new_owner
from gateway.flow_control.service_rate import ServiceRate
from gateway.flow_control.stats import FlowObserver
from gateway.keys import LEASE_MARGIN_S, longest_deadline
from gateway.keys.resp import RespClient
from gateway.observability.metrics import Metrics

NO_BACKEND_TABLE = BackendFlowConfig()


class FlowControl:
    """The policy and the queue of each backend, for the request path (`queue_of`) and the
    gateway's drain and close."""

    def __init__(self, policy: FlowPolicy, queues: dict[str, FlowQueue], client: RespClient | None) -> None:
        self.policy = policy
        self.queues = queues
        self.client = client  # the shared RESP client, when the ledgers are in Redis

    def queue_of(self, backend: str) -> FlowQueue | None:
        return self.queues.get(backend)

    def fail_waiters(self, error: BaseException) -> None:
        for queue in self.queues.values():
            queue.fail_waiters(error)

    async def close(self) -> None:
        for queue in self.queues.values():
            await queue.close()
        if self.client is not None:
            await self.client.close()


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
        return MemoryLedger(num_bands, config.aging_s or None, owner=owner)
    from gateway.flow_control.ledger.redis_ledger import RedisLedger  # only where Redis is used

    return RedisLedger(client, backend, num_bands=num_bands, aging_s=config.aging_s or None, owner=owner, lease_s=lease_s,
                       expiry_s=limits.queue_timeout_s)


def build_flow_control(config: Config, backends: Mapping[str, Any], metrics: Metrics, *,
                       observer: FlowObserver | None = None) -> FlowControl | None:
    """Flow control for `backends` (name -> backend) under `config`; None when it is off.
    Registers its metrics in `metrics` (with several workers, the queue depth through
    `Metrics.show_live`: call with the event loop running)."""
    server = config.server
    flow = server.flow_control
    if not flow.enabled:
        return None
    policy = FlowPolicy(flow)
    client = None if server.state is None else RespClient(server.state, timeout_s=server.state_timeout_s)
    workers = server.workers if isinstance(server.workers, int) and client is None else 1
    owner = new_owner()
    lease_s = longest_deadline(config) + LEASE_MARGIN_S
    flow_metrics = FlowMetrics(metrics.registry, tenants_bounded=policy.tenants.bounded)
    queues: dict[str, FlowQueue] = {}
    for cfg in config.backends:
        backend = backends.get(cfg.name)
        if backend is None:
            continue
        table = cfg.flow_control or NO_BACKEND_TABLE
        capacity, has_room = backend_readings(backend, max_concurrent=cfg.max_concurrent,
                                              replica_concurrency=table.replica_concurrency, workers=workers)
        headroom = backend_headroom(backend, max_concurrent=cfg.max_concurrent, replica_concurrency=table.replica_concurrency,
                                    headroom=table.priority_headroom, workers=workers)
        limits = queue_limits(flow, table)
        ledger = build_ledger(cfg.name, flow, limits, client=client, owner=owner, lease_s=lease_s)
        queues[cfg.name] = FlowQueue(cfg.name, ledger, capacity, has_room=has_room, headroom=headroom, limits=limits,
                                     rate=ServiceRate(flow.rate_smoothing), observer=observer or flow_metrics,
                                     on_state_error=server.on_state_error)
    metrics.show_live(DepthCollector(queues, flow_metrics), WORKER_MODES)
    return FlowControl(policy, queues, client)
