"""`sticky`: the same key always lands on the same target — weighted rendezvous hashing of the
key and the route's name, so every replica and every restart agrees without shared state, a
target that goes down moves only its own keys, and a weight change moves only the share it must.

The key is the first of the route's `options.key` sources the request has: `"session"` (the
agent session it belongs to, `RequestSpec.session`: `prompt_cache_key`, Claude Code's or Codex's
session id), `"user"` (the body's `user` field), `"header:<name>"` (a client header the gateway
copied into `RequestSpec.headers`), `"api_key"` (a hash of the client's API key, which the
gateway puts under `API_KEY_HASH_HEADER`; never the key). A request with none of them is split
by weight.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import msgspec

from plugins.contract.config_types import Route, Target
from plugins.contract.errors import ConfigError
from plugins.contract.protocol import RequestSpec
from plugins.routing.weighted import pick_weighted

# The pseudo-header under which the gateway hands the sticky strategy a hash of the client's
# API key (hex SHA-256 of the bearer token): stable per key, useless to anyone who reads it.
API_KEY_HASH_HEADER = "x-switchyard-api-key-hash"
DEFAULT_STICKY_KEY = ("user", "api_key")
KEY_SOURCES = frozenset({"session", "user", "api_key"})  # and `header:<name>`
# Client headers that carry credentials: never a routing key, never copied into a RequestSpec.
AUTH_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})

_TWO_64 = float(2**64)


class StickyOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    key: tuple[str, ...] = DEFAULT_STICKY_KEY


def sticky_sources(route: Route) -> Sequence[str]:
    return route.options.get("key", DEFAULT_STICKY_KEY)


def sticky_key(spec: RequestSpec, sources: Sequence[str]) -> str | None:
    """The first source the request carries, tagged with its kind (so a user named like a
    session id is not the same key)."""
    for source in sources:
        if source == "session":
            value = spec.session
        elif source == "user":
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


class Sticky:
    options = StickyOptions

    def check(self, options: msgspec.Struct, where: str) -> None:
        assert isinstance(options, StickyOptions)
        for source in options.key:
            header = source.removeprefix("header:").lower()
            if source not in KEY_SOURCES and not (source.startswith("header:") and header):
                raise ConfigError(
                    f"sticky key source {source!r} is not `session`, `user`, `api_key` or `header:<name>` at `{where}.options.key`",
                    param=f"{where}.options.key",
                )
            if source.startswith("header:") and header in AUTH_HEADERS:
                raise ConfigError(
                    f"header {header!r} carries credentials and cannot be a sticky key (use `api_key`) at `{where}.options.key`",
                    param=f"{where}.options.key",
                )

    def pick(self, spec: RequestSpec, route: Route, candidates: Sequence[Target], in_flight: Mapping[str, int],
             load: Mapping[str, float]) -> Target:
        key = sticky_key(spec, sticky_sources(route))
        return pick_weighted(candidates) if key is None else pick_rendezvous(key, route.name, candidates)
