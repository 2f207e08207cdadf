"""Switchyard's hook specifications (pluggy project name `switchyard`).

Declarations only: each docstring is the contract — arguments, return value, who calls the hook
and when. Implementations are marked with `hookimpl` (also `plugins.hookimpl`,
`switchyard.plugin.hookimpl`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from plugins.contract.config_types import BackendType, Route, Target
    from plugins.contract.protocol import Backend, RequestSpec, Usage

hookspec = pluggy.HookspecMarker("switchyard")
hookimpl = pluggy.HookimplMarker("switchyard")


@hookspec
def switchyard_backend_types() -> list[BackendType]:
    """Return the backend types this plugin provides.

    Called once at start-up, before `plugins.toml`'s `[[backends]]` tables are validated. Each
    `BackendType` names a `type` (the value of `type = "..."` in a `[[backends]]` table), the
    msgspec Struct its `[backends.options]` table is decoded into (unknown keys and bad values stop
    start-up naming the key), and a factory `create(name, options) -> Backend`. A third-party
    engine is a package that implements this hook and registers under the entry-point group
    `switchyard`.
    """


@hookspec
def switchyard_route_strategies() -> list[str]:
    """Return the routing strategy names this plugin implements (`strategy = "..."` in a
    `[[routes]]` table). Called once at start-up; a route naming a strategy no plugin
    provides stops start-up."""


@hookspec(firstresult=True)
def switchyard_route(
    spec: RequestSpec, route: Route, candidates: list[Target], in_flight: Mapping[str, int], load: Mapping[str, float]
) -> Target | None:
    """Pick the target that serves `spec` on `route`.

    Called by the gateway on the event loop for every request whose model name is a route (must
    not block), with `candidates` the route's targets, in the route's order, whose backends'
    circuit breakers are not open (never empty). When a target fails before its first token
    and the route allows more attempts (`max_attempts`; `fallback` routes try every target),
    the gateway calls the hook again for the same request with the targets already tried left
    out. `in_flight` maps each backend name to the requests the gateway has in flight there
    (read-only; strategies such as `least_busy` use it); `load` maps each backend name to the
    load its engines report (requests running + waiting per replica; the in-flight count for a
    backend that reports none), read on demand (`least_load`, `prefix_cache`). `spec.headers` holds the client headers
    a route's options name as routing keys (never credentials). The first non-None result
    wins; a strategy plugin returns None for routes whose `strategy` is not its own.
    """


@hookspec
def switchyard_on_request(spec: RequestSpec, backend: Backend) -> None:
    """Observe a request about to be sent to `backend` (metrics, logs, A/B bookkeeping).

    Called on the event loop right before `backend.generate(spec)` — once per attempt when a
    fallback tries several backends, never for shadow copies; must not block. Raising a
    `plugins.contract.errors.SwitchyardError` rejects the request with that error.
    """


@hookspec
def switchyard_on_response(
    spec: RequestSpec, backend: Backend, usage: Usage | None, outcome: str, timings: dict[str, Any]
) -> None:
    """Observe a finished request.

    Called once per request after its last byte (or its failure or cancellation) with
    `backend` the one that served it (after a fallback: the last one tried), `outcome` one of
    "ok", "error:<ErrorClass>" or "cancelled", the backend's normalized `usage` (None when none
    arrived) and `timings` in seconds (`ttft`, `e2e`, and `itl` as a list), measured from the
    request's arrival. Not called for shadow copies of a request. Must not block.
    """
