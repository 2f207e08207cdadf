"""What `/metrics` shows of a queue: depth by backend, tenant and band (read at scrape time),
waits, admissions by path and sheds by reason — in a real Prometheus registry."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.errors import QueueShed
from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.metrics import DepthCollector, FlowMetrics
from gateway.flow_control.queue import Ask, FlowQueue, QueueLimits
from tests.gateway.flow_control.driving import until

pytestmark = pytest.mark.anyio


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of `name` carrying all of `labels`; None if none does."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_depth_waits_admissions_and_sheds() -> None:
    registry = CollectorRegistry()
    metrics = FlowMetrics(registry, tenants_bounded=True)
    queue = FlowQueue("llama", MemoryLedger(3, None), lambda: 1, observer=metrics,
                      limits=QueueLimits(max_queue=1, poll_interval_s=3600.0))
    registry.register(DepthCollector({"llama": queue}, metrics))
    try:
        holding = await queue.admit(Ask("team-a", 1, 100))
        waiter = asyncio.get_running_loop().create_task(queue.admit(Ask("team-b", 2, 100)))
        await until(lambda: queue.num_waiting == 1)
        with pytest.raises(QueueShed):
            await queue.admit(Ask("team-c", 1, 100))
        text = generate_latest(registry).decode()
        assert sample(text, "switchyard_flow_queue_depth", backend="llama", tenant="team-b", band="2") == 1
        assert sample(text, "switchyard_flow_admissions_total", tenant="team-a", path="immediate") == 1
        assert sample(text, "switchyard_flow_sheds_total", tenant="team-c", reason="queue_full") == 1
        holding.release()
        (await waiter).release()
        text = generate_latest(registry).decode()
        assert sample(text, "switchyard_flow_queue_depth", tenant="team-b") is None
        assert sample(text, "switchyard_flow_admissions_total", tenant="team-b", band="2", path="queued") == 1
        assert sample(text, "switchyard_flow_queue_wait_seconds_count", tenant="team-b", band="2") == 1
    finally:
        await queue.close()


def test_tenants_from_clients_do_not_become_labels() -> None:
    registry = CollectorRegistry()
    metrics = FlowMetrics(registry, tenants_bounded=False)
    metrics.shed("llama", "user=someone", 1, "slo")
    text = generate_latest(registry).decode()
    assert "someone" not in text
    assert sample(text, "switchyard_flow_sheds_total", tenant="-", reason="slo") == 1
