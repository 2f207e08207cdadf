"""`weighted` (the default): at random, in proportion to the targets' weights."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from plugins.contract.config_types import Route, Target
from plugins.contract.protocol import RequestSpec
from plugins.routing.base import Unchecked


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


class Weighted(Unchecked):
    def pick(self, spec: RequestSpec, route: Route, candidates: Sequence[Target], in_flight: Mapping[str, int],
             load: Mapping[str, float]) -> Target:
        return pick_weighted(candidates)
