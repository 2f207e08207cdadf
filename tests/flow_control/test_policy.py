"""From a request's facts to what it asks of the queue, and from the knobs to a queue."""

from __future__ import annotations

import msgspec
import pytest

from gateway.flow_control.build import build_queue, queue_limits
from gateway.flow_control.config import BackendFlowConfig, FlowControlConfig, KeyFlowFields
from gateway.flow_control.memory_ledger import MemoryLedger
from gateway.flow_control.policy import FlowPolicy
from gateway.flow_control.redis_ledger import RedisLedger
from gateway.flow_control.stats import FlowCounters
from gateway.keys.resp import RespClient

pytestmark = pytest.mark.anyio


def policy(**config: object) -> FlowPolicy:
    keys = {"gold": KeyFlowFields(weight=4.0), "batch": KeyFlowFields(priority=10)}
    return FlowPolicy(msgspec.convert(config, FlowControlConfig), keys)


def test_a_key_brings_its_weight_and_default_band() -> None:
    gold = policy().ask(key_name="gold", headers={}, user=None, priority_sent=None, cost=500, route_slo_ms=None)
    assert (gold.ask.tenant, gold.ask.weight, gold.ask.band, gold.ask.cost, gold.ask.slo_s, gold.priority) == ("gold", 4.0, 1, 500, None, 0)
    batch = policy().ask(key_name="batch", headers={}, user=None, priority_sent=None, cost=500, route_slo_ms=None)
    assert (batch.ask.band, batch.priority) == (2, 10)  # the engine is sent the key's priority too


def test_the_client_priority_policy_applies() -> None:
    honoured = policy().ask(key_name="batch", headers={}, user=None, priority_sent=-5, cost=1, route_slo_ms=None)
    assert (honoured.ask.band, honoured.priority) == (0, -5)
    capped = policy(client_priority="lower_only").ask(key_name="batch", headers={}, user=None, priority_sent=-5, cost=1,
                                                      route_slo_ms=None)
    assert (capped.ask.band, capped.priority) == (2, 10)


def test_tenant_source_and_slo_defaults() -> None:
    by_user = policy(tenant="user", ttft_slo_ms=2500)
    asked = by_user.ask(key_name="gold", headers={}, user="alice", priority_sent=None, cost=1, route_slo_ms=None)
    assert (asked.ask.tenant, asked.ask.weight, asked.ask.slo_s) == ("user=alice", 4.0, 2.5)  # a user under a key: its weight
    assert by_user.ask(key_name=None, headers={}, user=None, priority_sent=None, cost=1, route_slo_ms=800).ask.slo_s == 0.8


def test_a_backend_table_overrides_the_server_limits() -> None:
    server = msgspec.convert({"max_queue": 50, "queue_timeout_s": 20.0}, FlowControlConfig)
    assert (queue_limits(server, None).max_queue, queue_limits(server, None).queue_timeout_s) == (50, 20.0)
    limits = queue_limits(server, BackendFlowConfig(max_queue=5))
    assert (limits.max_queue, limits.queue_timeout_s) == (5, 20.0)


async def test_the_ledger_is_in_process_or_in_redis() -> None:
    config = msgspec.convert({"band_edges": [0, 1, 2]}, FlowControlConfig)
    common = {"capacity": lambda: 4, "has_room": None, "owner": "w1", "lease_s": 600.0, "observer": FlowCounters(),
              "on_state_error": "allow"}
    local = build_queue("llama", config, None, client=None, **common)  # type: ignore[arg-type]
    assert isinstance(local.ledger, MemoryLedger) and local.ledger.num_bands == 4
    client = RespClient("redis://127.0.0.1:6379/0", timeout_s=1.0)  # not connected until used
    shared = build_queue("llama", config, None, client=client, **common)  # type: ignore[arg-type]
    assert isinstance(shared.ledger, RedisLedger) and shared.ledger.num_bands == 4
    await client.close()
