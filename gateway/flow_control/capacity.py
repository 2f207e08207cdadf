"""A backend's readings for its queue (`FlowQueue(capacity=..., has_room=..., headroom=...)`).

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

With `priority_headroom` (`backend_headroom`), each replica has that many more slots that only
the top band may fill (its engine started with them: llama-server `-np`, vLLM
`max_num_seqs`): `fleet_headroom` counts them over the routable replicas — fewer on a replica
whose engine reports fewer slots than `replica_concurrency` plus the headroom (llama.cpp
`/slots`) — and the top band has room while some replica's load is below its concurrency plus
its headroom, its engine reporting no queue (with a headroom, `FlowQueue` reads this room for
the lower bands too: the ledger keeps them to the ordinary slots).

`backend.max_concurrent` bounds the whole backend when set. With several worker processes that
share no ledger (`[server] state` unset), each worker takes its share of the slots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from gateway.flow_control.queue import Headroom

UNBOUNDED = 2**31 - 1  # a capacity no count reaches (the Redis scripts take an integer)


class EngineReport(Protocol):
    waiting: float
    slots: int | None  # the engine's own slots, where it says (llama.cpp `/slots`)


class ReplicaLoad(Protocol):
    """What `plugins.fleet.replica.Replica` offers."""

    def load(self) -> float: ...

    def fresh_snapshot(self) -> EngineReport | None: ...


def fleet_capacity(routable: Iterable[object], replica_concurrency: int | None) -> int:
    if replica_concurrency is None:
        return UNBOUNDED
    return replica_concurrency * sum(1 for _ in routable)


def engine_headroom(replica: ReplicaLoad, replica_concurrency: int, headroom: int) -> int:
    """A replica's headroom: `headroom`, or what its engine's reported slots leave above
    `replica_concurrency` when that is less."""
    report = replica.fresh_snapshot()
    slots = None if report is None else report.slots
    return headroom if slots is None else max(0, min(headroom, slots - replica_concurrency))


def fleet_headroom(routable: Iterable[ReplicaLoad], replica_concurrency: int, headroom: int) -> int:
    return sum(engine_headroom(replica, replica_concurrency, headroom) for replica in routable)


def fleet_has_room(routable: Iterable[ReplicaLoad], replica_concurrency: int | None, headroom: int = 0) -> bool:
    """Some replica takes one more: below `replica_concurrency` (plus its `headroom`, for the top
    band) and its engine reporting no queue of its own."""
    for replica in routable:
        report = replica.fresh_snapshot()
        if report is not None and report.waiting > 0:
            continue
        if replica_concurrency is not None:
            limit = replica_concurrency + (engine_headroom(replica, replica_concurrency, headroom) if headroom else 0)
            if replica.load() >= limit:
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


def backend_headroom(backend: Any, *, max_concurrent: int | None, replica_concurrency: int | None, headroom: int,
                     workers: int = 1) -> Headroom | None:
    """The top band's `Headroom` on one backend: `headroom` slots per routable replica (a
    backend without replicas is one); None without any. `replica_concurrency` is what each
    replica runs besides (start-up requires it with a headroom)."""
    if headroom <= 0 or replica_concurrency is None:
        return None
    fleet = getattr(backend, "fleet", None)
    if fleet is not None:
        def fleet_slots() -> int:
            slots = fleet_headroom(fleet.routable_replicas(), replica_concurrency, headroom)
            return share_of(slots, workers) if slots else 0

        return Headroom(fleet_slots, lambda: fleet_has_room(fleet.routable_replicas(), replica_concurrency, headroom))
    mine = share_of(headroom, workers)
    load = getattr(backend, "load", None)
    if load is None:
        return Headroom(lambda: mine, lambda: True)
    engine_slots = (max_concurrent or replica_concurrency) + headroom
    return Headroom(lambda: mine, lambda: load() < engine_slots)
