"""`fallback`: the first target in the route's order. The gateway calls the hook again without
the targets that already failed, so a failure before the first token falls through the list."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from plugins.contract.config_types import Route, Target
from plugins.contract.protocol import RequestSpec
from plugins.routing.base import Unchecked


class Fallback(Unchecked):
    def pick(self, spec: RequestSpec, route: Route, candidates: Sequence[Target], in_flight: Mapping[str, int],
             load: Mapping[str, float]) -> Target:
        return candidates[0]
