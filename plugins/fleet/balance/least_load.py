"""`least_load`: the lower engine-reported load (running + waiting requests, per unit of
weight; then KV cache usage; then the gateway's in-flight count) of two candidates drawn at
random — power of two choices, so that several gateways, or one between two scrapes, do not all
pile onto the one replica that looked idle at the last scrape. Seeded: a fixed trace gives fixed
choices."""

from __future__ import annotations

import random
from collections.abc import Sequence

from plugins.contract.protocol import RequestSpec
from plugins.fleet.balance.base import C, Candidate, Choice, Stateless


def load_key(candidate: Candidate) -> tuple[float, float, int]:
    weight = candidate.weight
    load = candidate.load() / weight if weight > 0 else float("inf")
    return load, candidate.kv_cache_usage(), candidate.in_flight


class LeastLoad(Stateless):
    def __init__(self, seed: int = 0) -> None:
        self._random = random.Random(seed)

    def choose(self, spec: RequestSpec, candidates: Sequence[C]) -> Choice[C]:
        if len(candidates) == 1:
            return Choice(candidates[0], "least_load")
        pair = self._random.sample(list(candidates), 2)  # in random order: a tie goes either way
        return Choice(min(pair, key=load_key), "least_load")
