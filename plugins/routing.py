"""Built-in routing strategies behind the `switchyard_route` hook."""

from __future__ import annotations

import random

from plugins import hookimpl
from plugins.protocol import RequestSpec
from plugins.registry import Route, Target


@hookimpl
def switchyard_route_strategies() -> list[str]:
    return ["weighted"]


@hookimpl
def switchyard_route(spec: RequestSpec, route: Route, candidates: list[Target]) -> Target | None:
    """`weighted` (the default): pick a target at random in proportion to its weight."""
    if route.strategy != "weighted":
        return None
    if len(candidates) == 1:
        return candidates[0]
    weights = [t.weight for t in candidates]
    if sum(weights) <= 0:
        return candidates[0]
    return random.choices(candidates, weights=weights, k=1)[0]
