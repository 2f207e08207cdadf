"""The built-in routing plugin: the strategies of `plugins.routing`'s registry behind the
`switchyard_route_strategies` and `switchyard_route` hooks."""

from __future__ import annotations

from collections.abc import Mapping

from plugins.contract.config_types import Route, Target
from plugins.contract.hookspecs import hookimpl
from plugins.contract.protocol import RequestSpec
from plugins.routing import STRATEGIES


@hookimpl
def switchyard_route_strategies() -> list[str]:
    return list(STRATEGIES)


@hookimpl
def switchyard_route(spec: RequestSpec, route: Route, candidates: list[Target], in_flight: Mapping[str, int],
                     load: Mapping[str, float]) -> Target | None:
    strategy = STRATEGIES.get(route.strategy)
    return None if strategy is None else strategy.pick(spec, route, candidates, in_flight, load)
