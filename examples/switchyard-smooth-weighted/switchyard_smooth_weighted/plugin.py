"""Routing strategy `smooth_weighted`: nginx's smooth weighted round-robin.

Each pick adds every candidate's weight to its running score, takes the candidate with the
highest score and takes the candidates' total weight off the winner's score. Over any
`sum(weights)` consecutive requests each target gets exactly its weight's share, spread out
rather than in runs. Scores live per route and target in this process.
"""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.plugin import PLUGIN_API_VERSION, RequestSpec, Route, Target, hookimpl

if PLUGIN_API_VERSION[0] != 1:
    raise ImportError(f"switchyard-smooth-weighted needs Switchyard's plugin API 1.x, not {PLUGIN_API_VERSION}")

STRATEGY = "smooth_weighted"

_scores: dict[tuple[str, Target], float] = {}


@hookimpl
def switchyard_route_strategies() -> list[str]:
    return [STRATEGY]


@hookimpl
def switchyard_route(spec: RequestSpec, route: Route, candidates: list[Target], in_flight: Mapping[str, int]) -> Target | None:
    if route.strategy != STRATEGY:
        return None  # another plugin's route
    total = sum(t.weight for t in candidates)
    if total <= 0:
        return candidates[0]
    best = candidates[0]
    for target in candidates:
        key = (route.name, target)
        _scores[key] = _scores.get(key, 0.0) + target.weight
        if _scores[key] > _scores[(route.name, best)]:
            best = target
    _scores[(route.name, best)] -= total
    return best
