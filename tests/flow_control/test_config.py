"""The flow-control knobs: defaults, what start-up refuses (naming the key), bands from
`priority` and a key's default, and who a request counts against."""

from __future__ import annotations

import msgspec
import pytest

from gateway.flow_control.bands import Bands
from gateway.flow_control.config import BackendFlowConfig, FlowControlConfig, KeyFlowFields, RouteFlowFields, check_flow_config
from gateway.flow_control.cost import flow_cost
from gateway.flow_control.tenant import ANONYMOUS, TenantSource
from gateway.keys.limits import TokenCost
from plugins.errors import ConfigError


def test_defaults_leave_flow_control_off_with_three_aging_bands() -> None:
    config = msgspec.convert({}, FlowControlConfig)
    assert (config.enabled, config.tenant, config.band_edges, config.aging_s) == (False, "key", (0, 1), 30.0)
    assert (config.max_queue, config.queue_timeout_s, config.ttft_slo_ms) == (1024, 60.0, None)
    assert msgspec.convert({}, KeyFlowFields) == KeyFlowFields(weight=1.0, priority=None)
    assert msgspec.convert({}, RouteFlowFields).ttft_slo_ms is None
    assert msgspec.convert({}, BackendFlowConfig).replica_concurrency is None


@pytest.mark.parametrize("table", [
    {"tenant": "cookie"}, {"tenant": "header:"}, {"aging_s": 0}, {"max_queue": -1}, {"queue_timeout_s": 0},
    {"client_priority": "always"}, {"rate_smoothing": 1.5}, {"unknown": 1}, {"ttft_slo_ms": 0},
])
def test_bad_values_stop_start_up(table: dict[str, object]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(table, FlowControlConfig)


def test_a_key_weight_must_be_positive() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"weight": 0}, KeyFlowFields)


def test_band_edges_must_ascend_and_the_error_names_the_key() -> None:
    config = msgspec.convert({"band_edges": [5, 0]}, FlowControlConfig)
    with pytest.raises(ConfigError) as raised:
        check_flow_config(config, "plugins.toml")
    assert "server.flow_control.band_edges" in raised.value.message
    check_flow_config(msgspec.convert({"band_edges": [-5, 0, 10]}, FlowControlConfig), "plugins.toml")


def test_priority_maps_to_bands_lower_first() -> None:
    bands = Bands((0, 1))
    assert bands.num_bands == 3
    assert [bands.band_of(p) for p in (-100, -1, 0, 1, 7)] == [0, 0, 1, 2, 2]


@pytest.mark.parametrize(("policy", "sent", "key_default", "served_at"), [
    ("honour", None, None, 0), ("honour", None, 5, 5), ("honour", -3, 5, -3),
    ("lower_only", -3, 5, 5), ("lower_only", 9, 5, 9), ("ignore", -3, 5, 5),
])
def test_a_request_priority_against_its_key_default(policy: str, sent: int | None, key_default: int | None, served_at: int) -> None:
    assert Bands((0,), client_priority=policy).effective_priority(sent, key_default) == served_at  # type: ignore[arg-type]


def test_tenant_sources() -> None:
    headers = {"x-tenant": "acme", "x-session-id": "s-1"}
    assert TenantSource("key").tenant_of("team-a", "u-1", headers) == "team-a"
    assert TenantSource("user").tenant_of("team-a", "u-1", headers) == "user=u-1"
    assert TenantSource("session").tenant_of("team-a", None, headers) == "session=s-1"
    assert TenantSource("header:X-Tenant").tenant_of("team-a", None, headers) == "header:X-Tenant=acme"
    assert TenantSource("user").tenant_of("team-a", None, headers) == "team-a"  # none sent: its key
    assert TenantSource("key").tenant_of(None, None, {}) == ANONYMOUS
    assert TenantSource("key").bounded and not TenantSource("user").bounded


def test_cost_counts_the_prompt_and_output_up_to_the_cap() -> None:
    assert flow_cost(TokenCost(prompt=100, completion=30_000), 1024) == 1124
    assert flow_cost(TokenCost(prompt=100, completion=50), 1024) == 150
    assert flow_cost(TokenCost(prompt=100, completion=30_000), None) == 30_100
    assert flow_cost(TokenCost(prompt=0, completion=0), None) == 1
