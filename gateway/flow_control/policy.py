"""Per request, what flow control asks of a backend's queue: its tenant, weight, band, cost and
SLO (`FlowPolicy.ask`), and the priority the engine is sent (the band reaches vLLM and the
built-in engine as `priority`). Built once at start-up from `[server.flow_control]`; the request
path makes one call.

A request's cost in the fair order is the tokens it is expected to take: its prompt's estimate
plus what it may generate, counted up to `output_tokens_cap` (a request that asks for the whole
context is not charged for tokens it will most likely never produce). The reservation the
per-key limits make (`gateway.keys.limits.request_cost`) is the starting point.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gateway.config import FlowControlConfig
from gateway.flow_control.bands import Bands
from gateway.flow_control.queue import Ask
from gateway.flow_control.tenant import TenantSource
from gateway.keys.keyring import ClientKey
from gateway.keys.limits import TokenCost


class Asked(msgspec.Struct, frozen=True):
    ask: Ask
    priority: int  # what the engine is sent in `priority`


def flow_cost(reserved: TokenCost, output_tokens_cap: int) -> int:
    """Tokens: the prompt's estimate and the completion up to `output_tokens_cap` (0: no cap)."""
    completion = min(reserved.completion, output_tokens_cap) if output_tokens_cap else reserved.completion
    return max(1, reserved.prompt + completion)


class FlowPolicy:
    def __init__(self, config: FlowControlConfig) -> None:
        self.config = config
        self.bands = Bands(config.band_edges, config.client_priority)
        self.tenants = TenantSource(config.tenant)

    def ask(self, key: ClientKey | None, *, reserved: TokenCost, user: str | None = None, session: str | None = None,
            headers: Mapping[str, str] | None = None, priority_sent: int | None = None, slo_ms: int | None = None) -> Asked:
        """`key`: the client key (its name, `weight` and `priority`; None: no keys);
        `priority_sent`: the request's `priority` when the client sent one, else None;
        `reserved`: its tokens as the key limits count them; `slo_ms`: the `ttft_slo_ms` in
        force on its route (`RouteLimits`; None: no SLO)."""
        key_name, weight, key_priority = (None, 1.0, None) if key is None else (key.name, key.weight, key.priority)
        priority = self.bands.effective_priority(priority_sent, key_priority)
        tenant = self.tenants.tenant_of(key_name, user=user, session=session, headers=headers)
        cost = flow_cost(reserved, self.config.output_tokens_cap)
        ask = Ask(tenant, self.bands.band_of(priority), cost, weight, None if slo_ms is None else slo_ms / 1000)
        return Asked(ask, priority)
