"""`least_busy`, `least_load`, `prefix_cache`: the fleet's placement policy of that name
(`plugins.fleet.balance`) picking one of a route's targets, as it picks a replica inside a fleet
backend (`balance = "..."`) — one policy, whichever it chooses between.

- `least_busy`: the fewest of the gateway's requests in flight per unit of weight; ties take
  turns in proportion to the weights.
- `least_load`: the lower engine-reported load (per unit of weight) of two targets drawn at
  random.
- `prefix_cache`: the target that was sent the prompt's prefix, unless it is overloaded; else the
  least loaded (`options` are its index's knobs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from plugins.contract.config_types import Route, Target
from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance import Balancer, make_balancer
from plugins.fleet.options import PrefixCacheOptions
from plugins.routing.base import NoOptions, Unchecked


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


class Placement(Unchecked):
    def __init__(self, policy: str, options: type[msgspec.Struct] = NoOptions) -> None:
        self.policy = policy
        self.options = options
        # Each route's own policy object (its prefix index, its random source, its turns), made on
        # the route's first request. By the route's name, then its targets: a route redefined
        # (another gateway in the same process) gets its own.
        self._balancers: dict[str, list[tuple[tuple[Target, ...], Balancer]]] = {}

    def balancer(self, route: Route) -> Balancer:
        targets = route.targets
        made = self._balancers.setdefault(route.name, [])
        for made_for, balancer in made:
            if made_for is targets or made_for == targets:  # the same route object: no tuple compare
                return balancer
        options = msgspec.convert(route.options, PrefixCacheOptions) if self.options is PrefixCacheOptions else PrefixCacheOptions()
        balancer = make_balancer(self.policy, options)
        made.append((targets, balancer))
        return balancer

    def pick(self, spec: RequestSpec, route: Route, candidates: Sequence[Target], in_flight: Mapping[str, int],
             load: Mapping[str, float]) -> Target:
        views = [TargetView(t, in_flight, load) for t in candidates]
        return self.balancer(route).choose(spec, views).candidate.target
