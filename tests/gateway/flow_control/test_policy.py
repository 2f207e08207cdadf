"""From a request's facts to what it asks of the queue, and from the knobs to the queues."""

from __future__ import annotations

import msgspec
import pytest

from gateway.config import BackendFlowConfig, FlowControlConfig, parse_config
from gateway.flow_control.build import build_flow_control, queue_limits
from gateway.flow_control.ledger.memory_ledger import MemoryLedger
from gateway.flow_control.ledger.redis_ledger import RedisLedger
from gateway.flow_control.policy import FlowPolicy
from gateway.keys.keyring import ClientKey
from gateway.keys.limits import TokenCost
from gateway.observability.metrics import Metrics
from plugins.builtin.backend import BuiltinBackend
from plugins.builtin.options import BuiltinOptions

pytestmark = pytest.mark.anyio

GOLD = ClientKey("gold", b"", None, weight=4.0)
BATCH = ClientKey("batch", b"", None, priority=10)
COST = TokenCost(prompt=100, completion=400)


def policy(**config: object) -> FlowPolicy:
    return FlowPolicy(msgspec.convert(config, FlowControlConfig))


def test_a_key_brings_its_weight_and_default_band() -> None:
    gold = policy().ask(GOLD, reserved=COST)
    assert (gold.ask.tenant, gold.ask.weight, gold.ask.band, gold.ask.cost, gold.ask.slo_s, gold.priority) == ("gold", 4.0, 1, 500, None, 0)
    batch = policy().ask(BATCH, reserved=COST)
    assert (batch.ask.band, batch.priority) == (2, 10)  # the engine is sent the key's priority too
    assert policy().ask(None, reserved=COST).ask.tenant == "anonymous"


def test_the_client_priority_policy_applies() -> None:
    honoured = policy().ask(BATCH, reserved=COST, priority_sent=-5)
    assert (honoured.ask.band, honoured.priority) == (0, -5)
    capped = policy(client_priority="lower_only").ask(BATCH, reserved=COST, priority_sent=-5)
    assert (capped.ask.band, capped.priority) == (2, 10)


def test_tenant_source_slo_and_output_cap() -> None:
    asked = policy(tenant="user", output_tokens_cap=50).ask(GOLD, reserved=COST, user="alice", slo_ms=2500)
    assert (asked.ask.tenant, asked.ask.weight, asked.ask.slo_s, asked.ask.cost) == ("user=alice", 4.0, 2.5, 150)  # a user under a key: its weight


def test_a_backend_table_overrides_the_server_limits() -> None:
    server = msgspec.convert({"max_queue": 50, "queue_timeout_s": 20.0}, FlowControlConfig)
    assert (queue_limits(server, None).max_queue, queue_limits(server, None).queue_timeout_s) == (50, 20.0)
    limits = queue_limits(server, BackendFlowConfig(max_queue=5))
    assert (limits.max_queue, limits.queue_timeout_s) == (5, 20.0)


BACKENDS = '[[backends]]\nname = "local"\ntype = "builtin"\nmax_concurrent = 3\n[backends.flow_control]\nmax_queue = 7\n'


async def test_one_queue_per_backend_in_process_or_in_redis() -> None:
    backends = {"local": BuiltinBackend("local", msgspec.convert({}, BuiltinOptions))}
    assert build_flow_control(parse_config(BACKENDS, "t"), backends, Metrics()) is None  # off by default
    on = '[server.flow_control]\nenabled = true\nband_edges = [0, 1, 2]\n'
    flow = build_flow_control(parse_config(on + BACKENDS, "t"), backends, Metrics())
    assert flow is not None and flow.client is None
    queue = flow.queue_of("local")
    assert queue is not None and isinstance(queue.ledger, MemoryLedger) and queue.ledger.num_bands == 4
    assert (queue.capacity(), queue.limits.max_queue) == (3, 7)  # `max_concurrent` is the capacity
    await flow.close()
    shared = build_flow_control(parse_config(on.replace("[server.", '[server]\nstate = "redis://127.0.0.1:1/0"\n[server.')
                                             + BACKENDS, "t"), backends, Metrics())
    assert shared is not None and shared.client is not None  # one client for every ledger, not connected until used
    assert isinstance(shared.queue_of("local").ledger, RedisLedger)  # type: ignore[union-attr]
    await shared.close()
