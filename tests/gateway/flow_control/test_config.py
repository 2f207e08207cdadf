"""The flow-control knobs (`gateway.config`): defaults, what start-up refuses (naming the key),
bands from `priority` and a key's default, who a request counts against, and its cost."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.flow_control.bands import Bands
from gateway.flow_control.policy import flow_cost
from gateway.flow_control.tenant import ANONYMOUS, TenantSource
from gateway.keys.keyring import KeyRing
from gateway.keys.limits import TokenCost
from gateway.service.admission import RouteLimits
from plugins.contract.errors import ConfigError


def test_defaults_leave_flow_control_off_with_three_aging_bands() -> None:
    config = parse_config('[[backends]]\nname = "b"\ntype = "builtin"\n', "plugins.toml")
    flow = config.server.flow_control
    assert (flow.enabled, flow.tenant, flow.band_edges, flow.aging_s) == (False, "key", (0, 1), 30.0)
    assert (flow.max_queue, flow.queue_timeout_s, flow.ttft_slo_ms, flow.output_tokens_cap) == (1024, 60.0, None, 1024)
    assert config.backends[0].flow_control is None


def test_the_tables_read_into_keys_backends_and_routes() -> None:
    config = parse_config(
        '[server.flow_control]\nenabled = true\nttft_slo_ms = 3000\n'
        '[[server.keys]]\nname = "gold"\nkey = "sk-gold"\nweight = 4\n'
        '[[server.keys]]\nname = "batch"\nkey = "sk-batch"\npriority = 10\n'
        '[[backends]]\nname = "b"\ntype = "builtin"\n[backends.flow_control]\nreplica_concurrency = 2\nmax_queue = 8\n'
        '[[routes]]\nname = "fast"\nttft_slo_ms = 500\n[[routes.targets]]\nbackend = "b"\n'
        '[[routes]]\nname = "slow"\n[[routes.targets]]\nbackend = "b"\n',
        "plugins.toml",
    )
    keys = {k.name: (k.weight, k.priority) for k in KeyRing.from_config(config.server).keys}
    assert keys == {"gold": (4.0, None), "batch": (1.0, 10)}
    table = config.backends[0].flow_control
    assert table is not None and (table.replica_concurrency, table.max_queue, table.queue_timeout_s) == (2, 8, None)
    assert table.priority_headroom == 0  # default: no headroom, the top band waits like the others
    fast, slow = (RouteLimits.of(config.server, route) for route in config.routes)
    assert (fast.ttft_slo_ms, slow.ttft_slo_ms, RouteLimits.of(config.server).ttft_slo_ms) == (500, 3000, 3000)


@pytest.mark.parametrize(("text", "names"), [
    ('[server.flow_control]\ntenant = "cookie"\n', "at `server.flow_control.tenant`"),
    ('[server.flow_control]\ntenant = "header:"\n', "at `server.flow_control.tenant`"),
    ('[server.flow_control]\naging_s = -1\n', "at `server.flow_control.aging_s`"),
    ('[server.flow_control]\noutput_tokens_cap = -1\n', "at `server.flow_control.output_tokens_cap`"),
    ('[server.flow_control]\nmax_queue = -1\n', "at `server.flow_control.max_queue`"),
    ('[server.flow_control]\nqueue_timeout_s = 0\n', "at `server.flow_control.queue_timeout_s`"),
    ('[server.flow_control]\nclient_priority = "always"\n', "at `server.flow_control.client_priority`"),
    ('[server.flow_control]\nrate_smoothing = 1.5\n', "at `server.flow_control.rate_smoothing`"),
    ('[server.flow_control]\nttft_slo_ms = 0\n', "at `server.flow_control.ttft_slo_ms`"),
    ('[server.flow_control]\nunknown = 1\n', "unknown key at `server.flow_control.unknown`"),
    ('[server.flow_control]\nband_edges = [5, 0]\n', "`band_edges` must ascend strictly, got [5, 0] at `server.flow_control.band_edges`"),
    ('[server.flow_control]\nband_edges = [' + ", ".join(map(str, range(16))) + ']\n', "at most 15 `band_edges`"),
    ('[[server.keys]]\nname = "a"\nkey = "sk-1"\nweight = 0\n', "at `server.keys[0].weight`"),
    ('[[server.keys]]\nname = "a"\nkey = "sk-1"\npriority = "high"\n', "at `server.keys[0].priority`"),
    ('[[backends]]\nname = "b"\ntype = "builtin"\n[backends.flow_control]\nreplica_concurrency = 0\n',
     "at `backends[0].flow_control.replica_concurrency`"),
    ('[[backends]]\nname = "b"\ntype = "builtin"\n[backends.flow_control]\nslots = 2\n', "unknown key at `backends[0].flow_control.slots`"),
    ('[[backends]]\nname = "b"\ntype = "builtin"\n[backends.flow_control]\nreplica_concurrency = 2\npriority_headroom = -1\n',
     "at `backends[0].flow_control.priority_headroom`"),
    ('[[backends]]\nname = "b"\ntype = "builtin"\n[backends.flow_control]\npriority_headroom = 1\n',
     "`priority_headroom` is slots beyond `replica_concurrency`, which is not set, at `backends[0].flow_control.priority_headroom`"),
    ('[server.flow_control]\nband_edges = []\n[[backends]]\nname = "b"\ntype = "builtin"\n[backends.flow_control]\n'
     'replica_concurrency = 2\npriority_headroom = 1\n', "makes one band of every request, at `backends[0].flow_control.priority_headroom`"),
    ('[[backends]]\nname = "b"\ntype = "builtin"\n[[routes]]\nname = "r"\nttft_slo_ms = -5\n[[routes.targets]]\nbackend = "b"\n',
     "at `routes[0].ttft_slo_ms`"),
])
def test_bad_values_stop_start_up_naming_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, "plugins.toml")
    assert names in raised.value.message


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
    assert TenantSource("key").tenant_of("team-a", user="u-1", headers=headers) == "team-a"
    assert TenantSource("user").tenant_of("team-a", user="u-1", headers=headers) == "user=u-1"
    assert TenantSource("session").tenant_of("team-a", headers=headers) == "session=s-1"
    assert TenantSource("session").tenant_of("team-a", session="agent-7", headers=headers) == "session=agent-7"
    assert TenantSource("header:X-Tenant").tenant_of("team-a", headers=headers) == "header:X-Tenant=acme"
    assert TenantSource("user").tenant_of("team-a", headers=headers) == "team-a"  # none sent: its key
    assert TenantSource("key").tenant_of(None) == ANONYMOUS
    assert TenantSource("key").bounded and not TenantSource("user").bounded


def test_cost_counts_the_prompt_and_output_up_to_the_cap() -> None:
    assert flow_cost(TokenCost(prompt=100, completion=30_000), 1024) == 1124
    assert flow_cost(TokenCost(prompt=100, completion=50), 1024) == 150
    assert flow_cost(TokenCost(prompt=100, completion=30_000), 0) == 30_100  # 0: no cap
    assert flow_cost(TokenCost(prompt=0, completion=0), 0) == 1
