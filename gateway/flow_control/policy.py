"""Per request, what flow control asks of a backend's queue: its tenant, weight, band and SLO
(`FlowPolicy.ask`), and the priority the engine is sent (the band reaches vLLM and the built-in
engine as `priority`). Built once at start-up from `[server.flow_control]` and the keys' `weight`
and `priority`; the request path makes one call."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gateway.flow_control.bands import Bands
from gateway.flow_control.config import FlowControlConfig, KeyFlowFields
from gateway.flow_control.queue import Ask
from gateway.flow_control.tenant import TenantSource

DEFAULT_KEY = KeyFlowFields()


class Asked(msgspec.Struct, frozen=True):
    ask: Ask
    priority: int  # what the engine is sent in `priority`


class FlowPolicy:
    def __init__(self, config: FlowControlConfig, keys: Mapping[str, KeyFlowFields]) -> None:
        """`keys`: each `[[server.keys]]` name's `weight` and `priority`."""
        self.config = config
        self.keys = dict(keys)
        self.bands = Bands(config.band_edges, config.client_priority)
        self.tenants = TenantSource(config.tenant)

    def ask(self, *, key_name: str | None, headers: Mapping[str, str], user: str | None, priority_sent: int | None,
            cost: int, route_slo_ms: int | None) -> Asked:
        """`priority_sent`: the request's `priority` when the client sent one, else None;
        `route_slo_ms`: the route's own `ttft_slo_ms` (None: the server's default)."""
        key = self.keys.get(key_name or "", DEFAULT_KEY)
        priority = self.bands.effective_priority(priority_sent, key.priority)
        slo_ms = route_slo_ms if route_slo_ms is not None else self.config.ttft_slo_ms
        ask = Ask(self.tenants.tenant_of(key_name, user, headers), self.bands.band_of(priority), cost, key.weight,
                  None if slo_ms is None else slo_ms / 1000)
        return Asked(ask, priority)
