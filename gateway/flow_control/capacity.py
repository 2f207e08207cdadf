"""A fleet's two readings for its queue (`FlowQueue(capacity=..., has_room=...)`), from what the
fleet already knows of each routable replica: the load routing believes (`Replica.load()`:
the engine's running + waiting, corrected by the requests sent and finished since its scrape,
or this gateway's in-flight count once the scrape is stale) and the engine's last fresh report.

- `fleet_capacity`: the slots of the routable replicas — `replica_concurrency` each; without
  it, no count bounds the backend (`UNBOUNDED`) and only the engines' reports gate it.
- `fleet_has_room`: some routable replica is below its concurrency and its engine reports no
  queue of its own (a replica whose engine queues is full, whatever our counts say).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

UNBOUNDED = 2**31 - 1  # a capacity no count reaches (the Redis scripts take an integer)


class EngineReport(Protocol):
    waiting: float


class ReplicaLoad(Protocol):
    """What `plugins.fleet.replica.Replica` offers."""

    def load(self) -> float: ...

    def fresh_snapshot(self) -> EngineReport | None: ...


def fleet_capacity(routable: Iterable[object], replica_concurrency: int | None) -> int:
    if replica_concurrency is None:
        return UNBOUNDED
    return replica_concurrency * sum(1 for _ in routable)


def fleet_has_room(routable: Iterable[ReplicaLoad], replica_concurrency: int | None) -> bool:
    for replica in routable:
        report = replica.fresh_snapshot()
        if report is not None and report.waiting > 0:
            continue
        if replica_concurrency is not None and replica.load() >= replica_concurrency:
            continue
        return True
    return False
