"""`least_busy`: the candidate with the fewest of the gateway's own requests in flight per unit
of weight (a weight says relative capacity; one of weight 0 only when every weight is 0).

Ties take turns in proportion to the weights — smooth weighted round robin among the tied, as
nginx's upstream `weight` does: equal weights go round the list, and an idle 2:1 pair gets two
requests of every three on the first, so neither a fleet nor a route piles onto its first
candidate and a route's weights hold at idle. No random source: a fixed trace gives fixed
choices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance.base import C, Choice


class LeastBusy:
    def __init__(self) -> None:
        self._credit: dict[str, float] = {}  # per candidate: weight earned in ties, less turns taken

    def choose(self, spec: RequestSpec, candidates: Sequence[C]) -> Choice[C]:
        tied: list[C] = []
        least = math.inf
        for c in candidates:
            weight = c.weight
            if weight <= 0:
                continue
            busy = c.in_flight / weight
            if busy < least:
                tied, least = [c], busy
            elif busy == least:
                tied.append(c)
        if not tied:
            return Choice(candidates[0], "least_busy")
        return Choice(tied[0] if len(tied) == 1 else self._take_turn(tied), "least_busy")

    def _take_turn(self, tied: list[C]) -> C:
        """Each tied candidate earns its weight; the richest takes the turn and pays them all."""
        credit = self._credit
        chosen, chosen_name, richest, total = tied[0], "", -math.inf, 0.0
        for c in tied:
            name, weight = c.name, c.weight
            total += weight
            earned = credit[name] = credit.get(name, 0.0) + weight
            if earned > richest:
                chosen, chosen_name, richest = c, name, earned
        credit[chosen_name] = richest - total
        return chosen

    def failed(self, spec: RequestSpec, name: str) -> None:
        pass

    def forget(self, name: str) -> None:
        self._credit.pop(name, None)

    def cached_blocks(self, name: str) -> int:
        return 0
