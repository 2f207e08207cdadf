"""The knobs of flow control, as msgspec structs decoded with `plugins.toml` and checked once at
start-up (`check_flow_config`). Their tables, once wired into `gateway/config.py`:

- `[server.flow_control]` → `FlowControlConfig` (off unless `enabled`).
- `[backends.flow_control]` → `BackendFlowConfig`: one backend's own capacity and queue bounds.
- `[[server.keys]]` gains `weight` and `priority` (`KeyFlowFields` lists them with their types).
- `[[routes]]` gains `ttft_slo_ms` (`RouteFlowFields`); `[server.flow_control] ttft_slo_ms` is
  the default of routes that set none.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta, Struct

from plugins.errors import ConfigError

TENANT_SOURCE = r"^(key|user|session|header:[A-Za-z0-9_-]+)$"


class _Config(Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class FlowControlConfig(_Config):
    """`[server.flow_control]`: the queue each backend opens when it is full."""

    enabled: bool = False
    # who a request counts against in the fair order: the client key's `name`, the request's
    # `user`, its `x-session-id` header, or any header (`header:x-tenant`); a request without
    # one counts against its key (or "anonymous" without keys)
    tenant: Annotated[str, Meta(pattern=TENANT_SOURCE)] = "key"
    # `priority` (the vLLM extension: lower is served earlier) to band: band i holds the
    # priorities below edge i and at or above edge i-1. [0, 1]: negative = band 0 (first),
    # 0 = band 1 (the default), positive = band 2
    band_edges: tuple[int, ...] = (0, 1)
    # a waiting request rises one band per `aging_s` waited, so a low band is never starved;
    # None: bands are strict
    aging_s: Annotated[float, Meta(gt=0.0)] | None = 30.0
    # what a request may say about its own priority: "honour" it, "lower_only" (only ask to be
    # served later than its key's `priority`), or "ignore" it (the key's priority stands)
    client_priority: Literal["honour", "lower_only", "ignore"] = "honour"
    max_queue: Annotated[int, Meta(ge=0)] = 1024  # waiting requests per backend (all workers with `state`)
    queue_timeout_s: Annotated[float, Meta(gt=0.0)] = 60.0  # the longest wait; then 429 with Retry-After
    # the default time-to-first-token objective of routes without their own; None: no SLO shedding
    ttft_slo_ms: Annotated[int, Meta(ge=1)] | None = None
    # a request's cost in the fair order is its prompt's estimated tokens plus what it may
    # generate, counted up to this many output tokens (None: its whole `max_tokens`)
    output_tokens_cap: Annotated[int, Meta(ge=1)] | None = 1024
    # how fast the service rate forgets: each completion moves the average this far (0..1]
    rate_smoothing: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.2
    # while requests wait: how often this worker re-reads capacity and collects the grants other
    # workers made to its waiters (with `state`); a freed slot in this worker wakes at once
    poll_interval_s: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.02


class BackendFlowConfig(_Config):
    """`[backends.flow_control]`: one backend's capacity and queue bounds (None: the server's)."""

    # requests each replica runs at once; None: the engine's own report (llama.cpp slots, vLLM
    # running + waiting) decides, and a replica is full once its engine reports any waiting
    replica_concurrency: Annotated[int, Meta(ge=1)] | None = None
    max_queue: Annotated[int, Meta(ge=0)] | None = None
    queue_timeout_s: Annotated[float, Meta(gt=0.0)] | None = None


class KeyFlowFields(_Config):
    """The fields `[[server.keys]]` gains (`KeyConfig`)."""

    weight: Annotated[float, Meta(gt=0.0)] = 1.0  # the key's share of a full backend, against others
    priority: int | None = None  # the `priority` of its requests that send none (None: 0)


class RouteFlowFields(_Config):
    """The field `[[routes]]` gains (`RouteConfig`)."""

    ttft_slo_ms: Annotated[int, Meta(ge=1)] | None = None  # None: `server.flow_control.ttft_slo_ms`


def check_flow_config(config: FlowControlConfig, source: str, where: str = "server.flow_control") -> None:
    """What msgspec's constraints cannot say: the band edges ascend strictly."""
    edges = config.band_edges
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"{source}: `band_edges` must ascend strictly, got {edges} at `{where}.band_edges`",
                          param=f"{where}.band_edges")
    if len(edges) > 15:
        raise ConfigError(f"{source}: at most 15 `band_edges` (16 bands), got {len(edges)} at `{where}.band_edges`",
                          param=f"{where}.band_edges")


def header_of(tenant_source: str) -> str | None:
    """The header a tenant source names (lower case), or None."""
    match = re.match(r"^header:(.+)$", tenant_source)
    return match[1].lower() if match else None
