"""Placement policies, one per file behind `base.Balancer`, built by name from this registry.

Used inside a proxy backend to pick one of its replicas (`balance = "..."`) and by the routing
plugin to pick one of a route's targets (`strategy = "least_load"` / `"prefix_cache"`)."""

from __future__ import annotations

from collections.abc import Callable

from plugins.fleet.balance.base import Balancer, Candidate, Choice
from plugins.fleet.balance.least_busy import LeastBusy
from plugins.fleet.balance.least_load import LeastLoad
from plugins.fleet.balance.prefix_cache import PrefixCache
from plugins.fleet.balance.round_robin import RoundRobin
from plugins.fleet.options import PrefixCacheOptions

BALANCERS: dict[str, Callable[[PrefixCacheOptions], Balancer]] = {
    "round_robin": lambda _: RoundRobin(),
    "least_busy": lambda _: LeastBusy(),
    "least_load": lambda _: LeastLoad(),
    "prefix_cache": PrefixCache,
}


def make_balancer(name: str, prefix_cache: PrefixCacheOptions = PrefixCacheOptions()) -> Balancer:
    return BALANCERS[name](prefix_cache)


__all__ = ["BALANCERS", "Balancer", "Candidate", "Choice", "make_balancer"]
