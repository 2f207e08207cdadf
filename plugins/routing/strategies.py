"""Built-in routing strategies behind the `switchyard_route` hook.

- `weighted` (the default): at random, in proportion to the targets' weights.
- `sticky`: the same key always lands on the same target — weighted rendezvous hashing of the
  key and the route's name, so every replica and every restart agrees without shared state, a
  target that goes down moves only its own keys, and a weight change moves only the share it
  must. The key is the first of the route's `options.key` sources the request has: `"user"`
  (the body's `user` field), `"header:<name>"` (a client header the gateway copied into
  `RequestSpec.headers`), `"api_key"` (a hash of the client's API key, which the gateway puts
  under `API_KEY_HASH_HEADER`; never the key). A request with none of them is split by weight.
- `least_busy`: the target whose backend has the fewest requests in flight per unit of weight.
- `least_load`: the lower engine-reported load (requests per replica, per unit of weight) of two
  targets drawn at random (`plugins.fleet.balance.least_load`).
- `prefix_cache`: the target that was sent the prompt's prefix, unless it is overloaded; else
  the least loaded (`plugins.fleet.balance.prefix_cache`; `options` are its index's knobs).
  The same policies pick a replica inside a fleet backend (`balance = "..."`).
- `fallback`: the first target in the route's order; the gateway calls the hook again without
  the targets that already failed, so a failure before the first token falls through the list.

Options of these strategies are decoded once at start-up by `check_options` (unknown keys and
bad values stop start-up); the hook itself only reads them.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping, Sequence

import msgspec

from plugins.contract.hookspecs import hookimpl
from plugins.contract.errors import ConfigError
from plugins.fleet.balance import Balancer, make_balancer
from plugins.fleet.options import PrefixCacheOptions
from plugins.contract.protocol import RequestSpec
from plugins.contract.config_types import Route, Target

# The pseudo-header under which the gateway hands the sticky strategy a hash of the client's
# API key (hex SHA-256 of the bearer token): stable per key, useless to anyone who reads it.
API_KEY_HASH_HEADER = "x-switchyard-api-key-hash"
DEFAULT_STICKY_KEY = ("user", "api_key")
# Client headers that carry credentials: never a routing key, never copied into a RequestSpec.
AUTH_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})

_TWO_64 = float(2**64)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


class StickyOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    key: tuple[str, ...] = DEFAULT_STICKY_KEY


class NoOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


STRATEGY_OPTIONS: dict[str, type[msgspec.Struct]] = {
    "weighted": NoOptions,
    "sticky": StickyOptions,
    "least_busy": NoOptions,
    "fallback": NoOptions,
    "least_load": NoOptions,
    "prefix_cache": PrefixCacheOptions,
}


def check_options(route: Route, where: str) -> msgspec.Struct:
    """Decode `route.options` for a built-in strategy; a `ConfigError` names the bad key
    (`where` is the route's TOML path, e.g. `routes[0]`)."""
    try:
        options = msgspec.convert(route.options, STRATEGY_OPTIONS[route.strategy])
    except msgspec.ValidationError as exc:
        reason, _, path = str(exc).partition(" - at `$")
        key = f"{where}.options{path.rstrip('`')}"
        unknown = _UNKNOWN.search(reason)
        if unknown:
            reason, key = "unknown key", f"{key}.{unknown['field']}"
        raise ConfigError(f"{reason} at `{key}`", param=key) from None
    if isinstance(options, StickyOptions):
        for source in options.key:
            header = source.removeprefix("header:").lower()
            if source not in ("user", "api_key") and not (source.startswith("header:") and header):
                raise ConfigError(
                    f"sticky key source {source!r} is not `user`, `api_key` or `header:<name>` at `{where}.options.key`",
                    param=f"{where}.options.key",
                )
            if source.startswith("header:") and header in AUTH_HEADERS:
                raise ConfigError(
                    f"header {header!r} carries credentials and cannot be a sticky key (use `api_key`) at `{where}.options.key`",
                    param=f"{where}.options.key",
                )
    return options


def sticky_sources(route: Route) -> Sequence[str]:
    return route.options.get("key", DEFAULT_STICKY_KEY)


@hookimpl
def switchyard_route_strategies() -> list[str]:
    return list(STRATEGY_OPTIONS)


@hookimpl
def switchyard_route(spec: RequestSpec, route: Route, candidates: list[Target], in_flight: Mapping[str, int],
                     load: Mapping[str, float]) -> Target | None:
    strategy = route.strategy
    if strategy in ("least_load", "prefix_cache"):
        views = [TargetView(t, in_flight, load) for t in candidates]
        return route_balancer(route).choose(spec, views).candidate.target
    if strategy == "weighted":
        return pick_weighted(candidates)
    if strategy == "sticky":
        key = sticky_key(spec, sticky_sources(route))
        return pick_weighted(candidates) if key is None else pick_rendezvous(key, route.name, candidates)
    if strategy == "least_busy":
        return pick_least_busy(candidates, in_flight)
    if strategy == "fallback":
        return candidates[0]
    return None


def pick_weighted(candidates: Sequence[Target]) -> Target:
    if len(candidates) == 1:
        return candidates[0]
    total = 0.0
    for t in candidates:
        total += t.weight
    if total <= 0:
        return candidates[0]
    point = random.random() * total
    for t in candidates:
        point -= t.weight
        if point < 0:
            return t
    return candidates[-1]


def sticky_key(spec: RequestSpec, sources: Sequence[str]) -> str | None:
    """The first source the request carries, tagged with its kind (so a user named like a
    session id is not the same key)."""
    for source in sources:
        if source == "user":
            value = spec.user
        elif source == "api_key":
            value = spec.headers.get(API_KEY_HASH_HEADER)
        else:
            value = spec.headers.get(source[7:].lower())
        if value:
            return f"{source}={value}"
    return None


def rendezvous_score(key: str, route: str, target: Target) -> float:
    """Weighted highest-random-weight score: -weight / ln(u), u uniform in (0, 1) from a hash of
    (route, key, target). The target with the highest score wins; a target's share of keys is
    its share of the weight, and changing one weight only moves keys to or from that target."""
    if target.weight <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{route}\x00{key}\x00{target.backend}\x00{target.model}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / _TWO_64
    return -target.weight / math.log(u)


def pick_rendezvous(key: str, route: str, candidates: Sequence[Target]) -> Target:
    best = candidates[0]
    best_score = -1.0
    for target in candidates:
        score = rendezvous_score(key, route, target)
        if score > best_score:
            best, best_score = target, score
    return best


def pick_least_busy(candidates: Sequence[Target], in_flight: Mapping[str, int]) -> Target:
    """Fewest requests in flight per unit of weight (a weight says relative capacity); ties
    are split by weight at random so that an idle gateway does not pile onto the first target."""
    best: list[Target] = []
    best_load = math.inf
    for target in candidates:
        if target.weight <= 0:
            continue
        load = in_flight.get(target.backend, 0) / target.weight
        if load < best_load:
            best, best_load = [target], load
        elif load == best_load:
            best.append(target)
    if not best:
        return candidates[0]
    return pick_weighted(best)


class TargetView:
    """A route's target as a placement policy sees it (`plugins.fleet.balance.base.Candidate`):
    its backend's in-flight count and load, the target's weight."""

    __slots__ = ("target", "_in_flight", "_load")

    def __init__(self, target: Target, in_flight: Mapping[str, int], load: Mapping[str, float]) -> None:
        self.target = target
        self._in_flight = in_flight
        self._load = load

    @property
    def name(self) -> str:
        return f"{self.target.backend}/{self.target.model}"

    @property
    def in_flight(self) -> int:
        return self._in_flight.get(self.target.backend, 0)

    @property
    def weight(self) -> float:
        return self.target.weight

    def load(self) -> float:
        return self._load.get(self.target.backend, float(self.in_flight))

    def kv_cache_usage(self) -> float:
        return 0.0

    def cache_tokens(self) -> int | None:
        return None


# The placement policy of each route that uses one (its prefix index, its random source), made on
# the route's first request. Keyed by the route's name and targets: a route redefined (another
# gateway in the same process) gets its own.
_ROUTE_BALANCERS: dict[tuple[str, str, tuple[Target, ...]], Balancer] = {}


def route_balancer(route: Route) -> Balancer:
    key = (route.name, route.strategy, route.targets)
    balancer = _ROUTE_BALANCERS.get(key)
    if balancer is None:
        options = msgspec.convert(route.options, PrefixCacheOptions) if route.strategy == "prefix_cache" else PrefixCacheOptions()
        balancer = _ROUTE_BALANCERS[key] = make_balancer(route.strategy, options)
    return balancer
