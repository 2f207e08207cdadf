"""A backend's two readings for its queue (`FlowQueue(capacity=..., has_room=...)`).

A fleet (a proxy backend's `fleet`: `plugins.fleet.fleet.Fleet`) reads them from each routable
replica (`routable_replicas()`): the load routing believes (`Replica.load()`: the engine's running
+ waiting, corrected by the requests sent and finished since its scrape, or this gateway's
in-flight count once the scrape is stale) and the engine's last fresh report.

- `fleet_capacity`: the slots of the routable replicas — `replica_concurrency` each; without
  it, no count bounds the backend (`UNBOUNDED`) and only the engines' reports gate it.
- `fleet_has_room`: some routable replica is below its concurrency and its engine reports no
  queue of its own (a replica whose engine queues is full, whatever our counts say).

A backend without replicas (the built-in engine, a third-party backend) is one replica: its
`load()` (the engine's unfinished requests) against its slots — `max_concurrent`,
`replica_concurrency`, else what the backend says it runs at once (`max_running()`: the built-in
engine's `max_num_seqs`).

`backend.max_concurrent` bounds the whole backend when set. With several worker processes that
share no ledger (`[server] state` unset), each worker takes its share of the slots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

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


def share_of(slots: int, workers: int) -> int:
    """One worker's part of `slots` when `workers` processes each keep their own ledger."""
    return slots if slots >= UNBOUNDED or workers <= 1 else max(1, slots // workers)


def backend_readings(backend: Any, *, max_concurrent: int | None, replica_concurrency: int | None,
                     workers: int = 1) -> tuple[Callable[[], int], Callable[[], bool]]:
    """`capacity()` and `has_room()` of one backend (see the module); `workers`: the worker
    processes whose ledgers are their own (1 with a shared ledger)."""
    fleet = getattr(backend, "fleet", None)
    if fleet is not None:
        def fleet_slots() -> int:
            slots = max_concurrent if max_concurrent is not None else fleet_capacity(fleet.routable_replicas(), replica_concurrency)
            return share_of(slots, workers)

        return fleet_slots, lambda: fleet_has_room(fleet.routable_replicas(), replica_concurrency)
    slots = max_concurrent or replica_concurrency
    if slots is None:
        max_running = getattr(backend, "max_running", None)
        slots = max_running() if max_running is not None else None
    load = getattr(backend, "load", None)
    if slots is None or load is None:
        bound = share_of(slots or UNBOUNDED, workers)
        return (lambda: bound), (lambda: True)
    engine_slots = slots
    mine = share_of(slots, workers)
    return (lambda: mine), (lambda: load() < engine_slots)
