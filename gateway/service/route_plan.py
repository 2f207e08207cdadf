"""What the gateway keeps per route besides the `Route` the plugins see, and the start-up check
that every route's strategy exists."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pluggy

from gateway.config import Config, ShadowConfig
from gateway.service.admission import RouteLimits
from gateway.service.model_names import is_glob
from plugins.contract.config_types import Route, Target
from plugins.contract.errors import ConfigError
from plugins.routing import STRATEGIES, check_options
from plugins.routing import hooks as routing_hooks
from plugins.routing.sticky import sticky_sources


@dataclass(frozen=True)
class RoutePlan:
    """What the gateway needs per route besides the `Route` the plugins see, built once."""

    route: Route
    max_attempts: int = 1
    shadow: ShadowConfig | None = None
    shadow_model: str = ""
    key_headers: tuple[str, ...] = ()  # client headers copied into spec.headers (lower case)
    key_api_key: bool = False  # hash the client's API key into spec.headers
    arms: Mapping[Target, str] = field(default_factory=dict)  # the request log's arm label per target
    limits: RouteLimits = RouteLimits()

    @classmethod
    def build(
        cls, route: Route, max_attempts: int | None = None, shadow: ShadowConfig | None = None, limits: RouteLimits = RouteLimits()
    ) -> RoutePlan:
        backends = [t.backend for t in route.targets]
        unique = len(set(backends)) == len(backends)
        arms = {t: t.backend if unique else f"{t.backend}/{t.model}" for t in route.targets}
        headers: tuple[str, ...] = ()
        api_key = False
        if route.strategy == "sticky":
            sources = sticky_sources(route)
            headers = tuple(s[len("header:") :].lower() for s in sources if s.startswith("header:"))
            api_key = "api_key" in sources
        if max_attempts is None:
            max_attempts = len(route.targets) if route.strategy == "fallback" else 1
        return cls(
            route=route,
            max_attempts=max_attempts,
            shadow=shadow,
            shadow_model=(shadow.model or route.name) if shadow else "",
            key_headers=headers,
            key_api_key=api_key,
            arms=arms,
            limits=limits,
        )

    def arm(self, target: Target) -> str:
        return self.arms.get(target) or target.backend


def validate_routes(config: Config, pm: pluggy.PluginManager) -> None:
    """Every route names a strategy some plugin provides; the built-in strategies' options decode;
    its names (`validate_names`) are unambiguous."""
    validate_names(config)
    strategies = {name for names in pm.hook.switchyard_route_strategies() for name in names}
    builtin_routing = pm.get_plugin("routing") is routing_hooks
    for i, (route, resolved) in enumerate(zip(config.routes, config.routes_resolved())):
        if route.strategy not in strategies:
            raise ConfigError(
                f"{config.source}: unknown routing strategy {route.strategy!r} at `routes[{i}].strategy` "
                f"(known: {', '.join(sorted(strategies))})"
            )
        if builtin_routing and route.strategy in STRATEGIES:
            try:
                check_options(resolved, f"routes[{i}]")
            except ConfigError as exc:
                raise ConfigError(f"{config.source}: {exc.message}", param=exc.param) from None


def validate_names(config: Config) -> None:
    """An exact alias is no other route's name or alias; a route named by a glob names each
    target's (and its shadow's) model, since the client's name is none of them."""
    owner = {route.name: f"routes[{i}].name" for i, route in enumerate(config.routes)}
    for i, route in enumerate(config.routes):
        for j, alias in enumerate(route.aliases):
            key = f"routes[{i}].aliases[{j}]"
            if not is_glob(alias) and alias in owner:
                raise ConfigError(f"{config.source}: alias {alias!r} of route {route.name!r} is already {owner[alias]} "
                                  f"at `{key}`", param=key)
            owner.setdefault(alias, key)
        if not is_glob(route.name):
            continue
        unnamed = [f"routes[{i}].targets[{j}].model" for j, t in enumerate(route.targets) if t.model is None]
        if route.shadow is not None and route.shadow.model is None:
            unnamed.append(f"routes[{i}].shadow.model")
        if unnamed:
            raise ConfigError(f"{config.source}: route {route.name!r} is a glob: say which model it serves at "
                              f"`{unnamed[0]}`", param=unnamed[0])
