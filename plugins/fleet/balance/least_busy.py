"""`least_busy`: the candidate with the fewest of the gateway's own requests in flight per unit
of weight; ties go round the list."""

from __future__ import annotations

from collections.abc import Sequence

from plugins.fleet.balance.base import C, Choice, Stateless, rotated
from plugins.contract.protocol import RequestSpec


class LeastBusy(Stateless):
    def __init__(self) -> None:
        self._turn = 0

    def choose(self, spec: RequestSpec, candidates: Sequence[C]) -> Choice[C]:
        self._turn += 1
        best = min(rotated(candidates, self._turn), key=lambda c: c.in_flight / c.weight if c.weight > 0 else float("inf"))
        return Choice(best, "least_busy")
