"""Routing strategies — which of a route's targets serves a request — one per file behind
`base.Strategy`, found by name in this registry; `hooks` offers them to the gateway through
`switchyard_route`.

- `weighted` (the default, `weighted.py`): at random, in proportion to the weights.
- `sticky` (`sticky.py`): the same key always lands on the same target (rendezvous hashing).
- `least_busy`, `least_load`, `prefix_cache` (`placement.py`): the fleet's placement policies of
  those names (`plugins.fleet.balance`), between a route's targets as between a fleet's replicas.
- `fallback` (`fallback.py`): the first target in the route's order.

A route's `options` are decoded once at start-up by `check_options` (unknown keys and bad values
stop start-up, naming the key); the hook itself only reads them.
"""

from __future__ import annotations

import re

import msgspec

from plugins.contract.config_types import Route
from plugins.contract.errors import ConfigError
from plugins.fleet.options import PrefixCacheOptions
from plugins.routing.base import Strategy
from plugins.routing.fallback import Fallback
from plugins.routing.placement import Placement
from plugins.routing.sticky import Sticky
from plugins.routing.weighted import Weighted

STRATEGIES: dict[str, Strategy] = {
    "weighted": Weighted(),
    "sticky": Sticky(),
    "least_busy": Placement("least_busy"),
    "fallback": Fallback(),
    "least_load": Placement("least_load"),
    "prefix_cache": Placement("prefix_cache", PrefixCacheOptions),
}

_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def check_options(route: Route, where: str) -> msgspec.Struct:
    """Decode `route.options` for a built-in strategy; a `ConfigError` names the bad key
    (`where` is the route's TOML path, e.g. `routes[0]`)."""
    strategy = STRATEGIES[route.strategy]
    try:
        options = msgspec.convert(route.options, strategy.options)
    except msgspec.ValidationError as exc:
        reason, _, path = str(exc).partition(" - at `$")
        key = f"{where}.options{path.rstrip('`')}"
        unknown = _UNKNOWN.search(reason)
        if unknown:
            reason, key = "unknown key", f"{key}.{unknown['field']}"
        raise ConfigError(f"{reason} at `{key}`", param=key) from None
    strategy.check(options, where)
    return options


__all__ = ["STRATEGIES", "Strategy", "check_options"]
