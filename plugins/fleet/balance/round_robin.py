"""`round_robin`: each request to the next candidate in turn."""

from __future__ import annotations

from collections.abc import Sequence

from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance.base import C, Choice, Stateless


class RoundRobin(Stateless):
    def __init__(self) -> None:
        self._turn = 0

    def choose(self, spec: RequestSpec, candidates: Sequence[C]) -> Choice[C]:
        self._turn += 1
        return Choice(candidates[(self._turn - 1) % len(candidates)], "round_robin")
